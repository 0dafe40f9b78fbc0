// TcpStoreServer under hostile or excessive load: what a client may send
// before AUTH, connection caps, and running out of file descriptors.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/distributed/store/detail/protocol.h"
#include "lockstep/distributed/store/detail/server_limits.h"
#include "lockstep/distributed/store/tcp_store.h"
#include "raw_store_client.h"
#include "support/forked_child.h"
#include "support/open_file_limit.h"
#include "support/stderr_capture.h"
#include "support/test_util.h"

using namespace lockstep::distributed;
using lockstep::testing::error_of;
using lockstep::testing::eventually;
using lockstep::testing::RawStoreClient;
using lockstep::testing::StderrCapture;
using namespace std::chrono_literals;
namespace proto = lockstep::distributed::store_protocol;

namespace {

const std::string kToken = "limits-test-token";

TcpStoreServerOptions server_options() { return {.host = "127.0.0.1", .port = 0, .token = kToken}; }

TcpStoreOptions client_options(uint16_t port) {
  return {
      .host = "127.0.0.1", .port = port, .token = kToken, .connect_timeout = 30s, .timeout = 30s};
}


// A frame header: magic, type, and a body length the bytes that follow need not honour.
std::vector<uint8_t> header(proto::MessageType type, uint32_t body_bytes) {
  std::vector<uint8_t> out = {'L', 'K', 'S', '1', static_cast<uint8_t>(type)};
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(body_bytes >> (8 * i)));
  return out;
}

int count_lines_with(const std::string& text, const std::string& needle) {
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) n += line.find(needle) != std::string::npos;
  return n;
}

/*
 * A TcpStoreServer in a forked child (the open-files limit is per process)
 * whose stderr comes to us through a pipe. Once serving, the child lowers its
 * RLIMIT_NOFILE so that exactly `spare` more descriptors fit, then serves
 * until we close its control pipe. Given `expected_clients`, it lowers the
 * limit first and makes a server told to expect them. Only plain calls in
 * the child: no Catch2.
 */
class ChildServer {
 public:
  explicit ChildServer(int spare, uint32_t expected_clients = 0) {
    int port_pipe[2], control[2], log[2];
    REQUIRE(pipe2(port_pipe, O_CLOEXEC) == 0);
    REQUIRE(pipe2(control, O_CLOEXEC) == 0);
    REQUIRE(pipe2(log, O_CLOEXEC) == 0);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      dup2(log[1], STDERR_FILENO);
      close(port_pipe[0]);
      close(control[1]);
      close(log[0]);
      close(log[1]);
      serve(port_pipe[1], control[0], spare, expected_clients);
    }
    close(port_pipe[1]);
    close(control[0]);
    close(log[1]);
    control_ = control[1];
    log_ = log[0];
    uint16_t port = 0;
    pollfd p{port_pipe[0], POLLIN, 0};
    if (poll(&p, 1, 20000) == 1 && read(port_pipe[0], &port, sizeof port) == sizeof port) {
      port_ = port;
    }
    close(port_pipe[0]);
    if (port_ == 0) {  // no server: do not leave the child behind
      kill(pid_, SIGKILL);
      stop();
    }
    REQUIRE(port_ != 0);
  }
  ~ChildServer() { stop(); }

  uint16_t port() const { return port_; }

  // What the child has logged so far (waits up to `limit` for `needle`).
  const std::string& log_until(const std::string& needle, std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (log_text_.find(needle) == std::string::npos) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !read_log(static_cast<int>(left.count()))) break;
    }
    return log_text_;
  }

  // Stops the child; returns everything it logged.
  const std::string& stop() {
    if (pid_ > 0) {
      close(control_);
      while (read_log(20000)) {
      }
      int status = 0;
      waitpid(pid_, &status, 0);
      exit_status_ = status;
      pid_ = -1;
      close(log_);
    }
    return log_text_;
  }
  int exit_status() const { return exit_status_; }

 private:
  [[noreturn]] static void serve(int port_fd, int control_fd, int spare,
                                 uint32_t expected_clients) {
    try {
      rlimit before{};
      if (expected_clients > 0) before = limit_descriptors(spare);
      auto options = server_options();
      options.expected_clients = expected_clients;
      TcpStoreServer server(options);
      {
        // One value stored before the limit: a sanitizer's first type check
        // of a stored value (UBSan's vptr check, in make_shared) opens a pipe
        // to probe memory, and reads a failed pipe as a bad object.
        TcpStore warm(client_options(server.port()));
        warm.set("warm", "up");
      }
      while (server.stats().connections > 0) usleep(1000);  // its descriptor closed too
      if (expected_clients == 0) before = limit_descriptors(spare);
      // (port_fd stays open: closing it would free one more descriptor)
      const uint16_t port = server.port();
      if (write(port_fd, &port, sizeof port) != sizeof port) _exit(3);
      char byte;
      while (read(control_fd, &byte, 1) > 0) {
      }
      // Descriptors back before the server shuts down: a sanitizer may need
      // one there (UBSan's type check opens a pipe to probe memory, and reads
      // a failed pipe as a bad object).
      setrlimit(RLIMIT_NOFILE, &before);
    } catch (...) {
      _exit(2);
    }
    _exit(0);
  }

  // Fills every free descriptor number up to one past the highest open one,
  // then sets the limit so that exactly `spare` numbers above those stay
  // free: the next `spare` opens succeed, then EMFILE.
  // Returns the limit it replaced.
  static rlimit limit_descriptors(int spare) {
    int highest = 0;
    if (DIR* dir = opendir("/proc/self/fd")) {
      const int own = dirfd(dir);
      while (dirent* entry = readdir(dir)) {
        const int fd = std::atoi(entry->d_name);
        if (fd != own && fd > highest) highest = fd;
      }
      closedir(dir);
    }
    for (int fd = open("/dev/null", O_RDONLY | O_CLOEXEC); fd >= 0 && fd < highest;
         fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) {
    }
    // (the loop's last open, kept, is `highest` + 1)
    rlimit limit{};
    getrlimit(RLIMIT_NOFILE, &limit);
    const rlimit before = limit;
    limit.rlim_cur = static_cast<rlim_t>(highest + 2 + spare);
    setrlimit(RLIMIT_NOFILE, &limit);
    return before;
  }

  bool read_log(int timeout_ms) {
    pollfd p{log_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return false;
    char buffer[4096];
    const ssize_t n = read(log_, buffer, sizeof buffer);
    if (n <= 0) return false;
    log_text_.append(buffer, static_cast<size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int control_ = -1, log_ = -1;
  uint16_t port_ = 0;
  std::string log_text_;
  int exit_status_ = -1;
};

}  // namespace

TEST_CASE("tcp store server: before AUTH a client may send a few KiB, not a big frame",
          "[store]") {
  TcpStoreServer server(server_options());  // frames up to 64 MiB once authenticated
  const auto type = GENERATE(proto::MessageType::Auth, proto::MessageType::Set);
  INFO("an unauthenticated " << proto::type_name(type) << " frame claiming a 32 MiB body");
  RawStoreClient raw(server.port());
  raw.send_bytes(header(type, 32u << 20));
  raw.send_bytes(std::vector<uint8_t>(1u << 20, 'x'));  // as much as the server takes
  CHECK(raw.closed_by_server());
  CHECK(eventually([&] { return server.rejected_clients() == 1; }));
  CHECK(eventually([&] { return server.stats().connections == 0; }));
  CHECK(server.stats().buffered_bytes == 0);

  TcpStore normal(client_options(server.port()));
  normal.set("still", std::string(1u << 20, 'v'));  // big frames are fine after AUTH
  CHECK(normal.get_string("still").size() == 1u << 20);
}

TEST_CASE("tcp store server: a long token still fits the allowance before AUTH", "[store]") {
  auto options = server_options();
  options.token = std::string(20000, 't');
  TcpStoreServer server(options);
  auto client = client_options(server.port());
  client.token = options.token;
  TcpStore store(client);
  store.set("k", "v");
  CHECK(store.get_string("k") == "v");
  CHECK(server.rejected_clients() == 0);
}

TEST_CASE("tcp store server: running out of descriptors is logged once, not per retry",
          "[store]") {
  const auto start = std::chrono::steady_clock::now();
  ChildServer child(/*spare=*/2);
  // Two clients fit; the rest wait in the listen backlog while accept fails.
  std::vector<std::unique_ptr<RawStoreClient>> clients;
  for (int i = 0; i < 16; ++i) clients.push_back(std::make_unique<RawStoreClient>(child.port()));
  REQUIRE_THAT(child.log_until("cannot accept", 20s), Catch::Contains("cannot accept"));
  // Stay out of descriptors long enough for many retries (it retries every 100 ms).
  std::this_thread::sleep_for(1500ms);

  // Descriptors freed: the server accepts again and serves a real client.
  clients.clear();
  TcpStore store(client_options(child.port()));
  store.set("k", "after");
  CHECK(store.get_string("k") == "after");

  const std::string log = child.stop();
  INFO("child server's log:\n" << log);
  CHECK((WIFEXITED(child.exit_status()) && WEXITSTATUS(child.exit_status()) == 0));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // At most one line per 10 s (plus the first).
  CHECK(count_lines_with(log, "cannot accept") <= 1 + static_cast<int>(seconds / 10));
  CHECK_THAT(log, Catch::Contains("ulimit -n"));
}

TEST_CASE("tcp store server: told how many clients to expect, it makes room for them under the "
          "hard open-file limit",
          "[store]") {
  // Room for 8 more descriptors, 40 clients: past the soft limit unless the
  // server raises it (the hard one is left as it is).
  constexpr int kClients = 40;
  ChildServer child(/*spare=*/8, kClients);
  std::vector<std::unique_ptr<TcpStore>> clients;
  auto options = client_options(child.port());
  options.connect_timeout = 10s;
  for (int i = 0; i < kClients; ++i) clients.push_back(std::make_unique<TcpStore>(options));
  for (auto& client : clients) client->add("n", 1);
  CHECK(clients.front()->add("n", 0) == kClients);
  clients.clear();
  const std::string log = child.stop();
  INFO("child server's log:\n" << log);
  CHECK((WIFEXITED(child.exit_status()) && WEXITSTATUS(child.exit_status()) == 0));
  CHECK_THAT(log, !Catch::Contains("cannot accept"));
}

TEST_CASE("tcp store server: expecting more clients than the hard open-file limit allows, it "
          "refuses to start, naming both numbers",
          "[store]") {
  const std::string error = lockstep::testing::error_in_forked_child([] {
    lockstep::testing::limit_open_files(16, 16);
    auto options = server_options();
    options.expected_clients = 1000;
    TcpStoreServer server(options);
  });
  CHECK_THAT(error, Catch::Contains("1000 clients need about 1008 more open files"));
  CHECK_THAT(error, Catch::Matches(".*this process has [0-9]+ open and may open at most [0-9]+ "
                                   "\\(its hard limit, ulimit -Hn\\).*"));
}

TEST_CASE("tcp store server: unauthenticated clients hold a few KiB each, not what they send",
          "[store]") {
  auto options = server_options();
  TcpStoreServer server(options);
  const uint32_t allowance = options.max_unauthenticated_bytes;
  constexpr int kClients = 8;
  std::vector<std::unique_ptr<RawStoreClient>> clients;
  for (int i = 0; i < kClients; ++i) {
    // The start of the largest AUTH frame the allowance admits, then silence.
    clients.push_back(std::make_unique<RawStoreClient>(server.port()));
    clients.back()->send_bytes(header(proto::MessageType::Auth, allowance - proto::kHeaderBytes));
    clients.back()->send_bytes(std::vector<uint8_t>(allowance - 100, 'x'));
  }
  REQUIRE(eventually([&] {
    const auto stats = server.stats();
    return stats.unauthenticated == kClients &&
           stats.buffered_bytes >= kClients * (allowance - 100);
  }));
  const auto held = server.stats();
  CHECK(held.connections == kClients);
  CHECK(held.buffered_bytes <= kClients * 2 * allowance);  // vector growth at most doubles it

  // Past the allowance each is closed; what they pushed is not kept.
  for (auto& client : clients) {
    client->send_bytes(std::vector<uint8_t>(1u << 20, 'x'));
    CHECK(client->closed_by_server());
  }
  CHECK(eventually([&] { return server.stats().connections == 0; }));
  CHECK(server.stats().buffered_bytes == 0);
  CHECK(server.stats().unauthenticated == 0);
  CHECK(server.rejected_clients() == kClients);
}

TEST_CASE("tcp store server: clients reading one big value share it, not a copy each",
          "[store]") {
  TcpStoreServer server(server_options());
  TcpStore writer(client_options(server.port()));
  Bytes big(16u << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 31 + 7);
  writer.set("big", big);
  // Every rank of a node reading it at once, none reading its reply yet.
  constexpr int kReaders = 32;
  std::vector<std::unique_ptr<RawStoreClient>> readers;
  for (int i = 0; i < kReaders; ++i) {
    readers.push_back(std::make_unique<RawStoreClient>(server.port()));
    readers.back()->send_frame(proto::MessageType::Auth, {kToken});
    readers.back()->send_frame(proto::MessageType::Get, {"big", proto::encode_i64(30'000)});
  }
  writer.num_keys();  // sent after the readers' requests
  std::this_thread::sleep_for(100ms);
  CHECK(server.stats().buffered_bytes < 4 * (1 << 20));  // before: a 16 MiB copy each

  // The replies still carry the value, whole, and in order among the others.
  CHECK(writer.get("big") == big);
  readers.clear();
  CHECK(eventually([&] { return server.stats().connections == 1; }));
  const std::string mid(200u << 10, 'm');
  writer.set("mid", mid);
  writer.set("small", "s");
  RawStoreClient pipelined(server.port());
  pipelined.send_frame(proto::MessageType::Auth, {kToken});
  for (const char* key : {"mid", "small", "mid"})
    pipelined.send_frame(proto::MessageType::Get, {key, proto::encode_i64(30'000)});
  REQUIRE(pipelined.read_frame().has_value());  // AUTH's
  for (const std::string& expected : {mid, std::string("s"), mid}) {
    const auto reply = pipelined.read_frame();
    REQUIRE(reply.has_value());
    CHECK(reply->fields == std::vector<std::string>{expected});
  }
}

TEST_CASE("tcp store server: connections are capped per peer address and in total", "[store]") {
  auto options = server_options();
  options.max_connections_per_address = 3;
  options.max_connections = 5;
  TcpStoreServer server(options);
  StderrCapture log;
  std::vector<std::unique_ptr<RawStoreClient>> held;
  const auto hold = [&](const char* source) {
    held.push_back(std::make_unique<RawStoreClient>(server.port(), source));
  };
  auto refused_client = client_options(server.port());
  refused_client.connect_timeout = 1s;
  // With the server full for `source`: more refusals are each counted, but
  // the log line is not repeated, and busy is not counted as bad input.
  const auto start = std::chrono::steady_clock::now();  // before the first refusal
  const auto refusals_are_quiet = [&](const char* source) {
    const int64_t before = server.stats().refused_connections;
    for (int i = 0; i < 10; ++i) {
      RawStoreClient extra(server.port(), source);
      CHECK(extra.closed_by_server());
    }
    CHECK(server.stats().refused_connections == before + 10);
    CHECK(server.rejected_clients() == 0);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    INFO("server log:\n" << log.text());
    CHECK(count_lines_with(log.text(), "turned away client") <=
          1 + static_cast<int>(seconds / 10));
  };

  SECTION("per address") {
    for (int i = 0; i < 3; ++i) hold("127.0.0.1");
    REQUIRE(eventually([&] { return server.stats().connections == 3; }));
    // A raw client is told why at once, in place of the AUTH reply.
    RawStoreClient extra(server.port(), "127.0.0.1");
    const auto reply = extra.read_frame();
    REQUIRE(reply.has_value());
    CHECK(reply->type == proto::MessageType::Error);
    CHECK_THAT(reply->fields.at(0),
               Catch::StartsWith("busy: ") && Catch::Contains("3 connections from 127.0.0.1"));
    // A real client retries until its connect timeout, then names the reason.
    const auto message = error_of([&] { TcpStore store(refused_client); });
    CHECK_THAT(message, Catch::Contains("turned the connection away") &&
                            Catch::Contains("3 connections from 127.0.0.1") &&
                            Catch::Contains("max_connections_per_address") &&
                            Catch::Contains(fmt::format("127.0.0.1:{}", server.port())));
    refusals_are_quiet("127.0.0.1");
    // Another address still gets in.
    RawStoreClient other(server.port(), "127.0.0.2");
    other.send_frame(proto::MessageType::Auth, {kToken});
    const auto ok = other.read_frame();
    REQUIRE(ok.has_value());
    CHECK(ok->type == proto::MessageType::Ok);
    // A closed connection makes room again.
    held.pop_back();
    REQUIRE(eventually([&] { return server.stats().connections == 3; }));
    TcpStore store(client_options(server.port()));
    store.set("k", "v");
    CHECK(store.get_string("k") == "v");
  }
  SECTION("in total") {
    for (int i = 0; i < 3; ++i) hold("127.0.0.1");
    for (int i = 0; i < 2; ++i) hold("127.0.0.2");
    REQUIRE(eventually([&] { return server.stats().connections == 5; }));
    RawStoreClient extra(server.port(), "127.0.0.3");
    const auto reply = extra.read_frame();
    REQUIRE(reply.has_value());
    CHECK(reply->type == proto::MessageType::Error);
    CHECK_THAT(reply->fields.at(0), Catch::StartsWith("busy: ") &&
                                        Catch::Contains("5 connections") &&
                                        Catch::Contains("max_connections)"));
    refusals_are_quiet("127.0.0.3");
  }
}

TEST_CASE("tcp store server: the default caps let one node of 512 ranks connect", "[store]") {
  // One connection per rank plus the launcher's, all from one address.
  constexpr int kClients = 520;
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  const rlim_t needed = 2 * kClients + 64;  // both ends live in this process
  if (files.rlim_max != RLIM_INFINITY && files.rlim_max < needed) {
    std::cout << "SKIPPED: needs " << needed << " open files, the hard limit is "
              << files.rlim_max << std::endl;
    return;
  }
  const rlimit saved = files;
  if (files.rlim_cur < needed) {
    files.rlim_cur = needed;
    REQUIRE(setrlimit(RLIMIT_NOFILE, &files) == 0);
  }
  {
    TcpStoreServer server(server_options());
    std::vector<std::unique_ptr<TcpStore>> clients;
    for (int i = 0; i < kClients; ++i) {
      clients.push_back(std::make_unique<TcpStore>(client_options(server.port())));
    }
    clients.front()->add("n", 0);
    for (auto& client : clients) client->add("n", 1);
    CHECK(clients.back()->add("n", 0) == kClients);
    CHECK(server.stats().connections == kClients);
    CHECK(server.stats().refused_connections == 0);
  }
  setrlimit(RLIMIT_NOFILE, &saved);
}

TEST_CASE("store limits: a repeated warning is let through once per interval, with a count",
          "[store]") {
  using store_limits::RateLimitedLog;
  RateLimitedLog log(std::chrono::seconds(10));
  const RateLimitedLog::Clock::time_point t0{};
  CHECK(log.note(t0) == std::optional<uint64_t>(0));  // the first occurrence: at once
  CHECK_FALSE(log.note(t0 + 1s).has_value());
  CHECK_FALSE(log.note(t0 + 9s).has_value());
  CHECK(log.note(t0 + 10s) == std::optional<uint64_t>(2));  // two held back since
  CHECK_FALSE(log.note(t0 + 19s).has_value());
  CHECK(log.note(t0 + 60s) == std::optional<uint64_t>(1));
}

TEST_CASE("store limits: connections are counted per address and released", "[store]") {
  store_limits::ConnectionCounter counter(/*max_total=*/3, /*max_per_address=*/2);
  CHECK_FALSE(counter.admit("10.0.0.1").has_value());
  CHECK_FALSE(counter.admit("10.0.0.1").has_value());
  const auto per_address = counter.admit("10.0.0.1");
  REQUIRE(per_address.has_value());
  CHECK_THAT(*per_address, Catch::Contains("2 connections from 10.0.0.1"));
  CHECK_FALSE(counter.admit("10.0.0.2").has_value());
  const auto total = counter.admit("10.0.0.3");
  REQUIRE(total.has_value());
  CHECK_THAT(*total, Catch::Contains("3 connections"));
  CHECK(counter.total() == 3);
  counter.release("10.0.0.1");
  CHECK(counter.total() == 2);
  CHECK_FALSE(counter.admit("10.0.0.1").has_value());
}
