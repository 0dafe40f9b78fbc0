// TcpStore and TcpStoreServer over loopback: every command, blocking calls,
// timeouts, many clients, tokens, and a server fed malformed input.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "lockstep/distributed/store/prefix_store.h"
#include "lockstep/distributed/store/detail/protocol.h"
#include "lockstep/distributed/store/tcp_store.h"
#include "lockstep/runtime/error.h"
#include "raw_store_client.h"
#include "support/forked_child.h"
#include "support/test_util.h"

using namespace lockstep::distributed;
using lockstep::testing::error_of;
using lockstep::testing::eventually;
using namespace std::chrono_literals;
namespace proto = lockstep::distributed::store_protocol;

namespace {

const std::string kToken = "test-token-42";

TcpStoreServerOptions server_options() { return {.host = "127.0.0.1", .port = 0, .token = kToken}; }

TcpStoreOptions client_options(uint16_t port) {
  return {
      .host = "127.0.0.1", .port = port, .token = kToken, .connect_timeout = 30s, .timeout = 30s};
}


using RawClient = lockstep::testing::RawStoreClient;

void authenticate(RawClient& raw) {
  raw.send_frame(proto::MessageType::Auth, {kToken});
  auto reply = raw.read_frame();
  REQUIRE(reply.has_value());
  REQUIRE(reply->type == proto::MessageType::Ok);
}

// A port with nobody listening: bind an ephemeral port, then let it go.
uint16_t unused_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// A socket listening on an ephemeral loopback port, which it names in `port`.
int loopback_listener(uint16_t& port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(listen(fd, 16) == 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  port = ntohs(addr.sin_port);
  return fd;
}

}  // namespace

TEST_CASE("tcp store: every command", "[store]") {
  TcpStoreServer server(server_options());
  REQUIRE(server.port() != 0);
  TcpStore store(client_options(server.port()));
  CHECK(store.address() == fmt::format("127.0.0.1:{}", server.port()));
  CHECK(store.local_address() == "127.0.0.1");

  CHECK(store.num_keys() == 0);
  store.set("a", "1");
  const Bytes binary{0, 1, 255, 0};
  store.set("bin", binary);
  store.set("empty", Bytes{});
  CHECK(store.get_string("a") == "1");
  CHECK(store.get("bin") == binary);
  CHECK(store.get("empty").empty());
  CHECK(store.num_keys() == 3);

  CHECK(store.add("n", 10) == 10);
  CHECK(store.add("n", -3) == 7);
  CHECK(store.get_string("n") == "7");
  CHECK_THAT(error_of([&] { store.add("bin", 1); }),
             Catch::Contains("'bin'") && Catch::Contains("not the decimal text"));
  // An ERROR reply leaves the connection usable.
  CHECK(store.add("n", 1) == 8);

  CHECK(to_string(store.compare_set("c", {}, to_bytes("v1"))) == "v1");
  CHECK(to_string(store.compare_set("c", to_bytes("no"), to_bytes("v2"))) == "v1");
  CHECK(to_string(store.compare_set("c", to_bytes("v1"), to_bytes("v2"))) == "v2");
  CHECK(store.compare_set("absent", to_bytes("x"), to_bytes("y")).empty());

  store.wait({"a", "n", "c"}, 5s);
  store.wait({});
  // "Forever" timeouts must not overflow anywhere.
  store.set_timeout(std::chrono::milliseconds::max());
  CHECK(store.get_string("a") == "1");
  store.wait({"a"}, std::chrono::milliseconds::max());
  store.set_timeout(30s);
  CHECK(store.delete_key("a"));
  CHECK_FALSE(store.delete_key("a"));
  CHECK(store.num_keys() == 4);

  // A 1 MiB value round-trips.
  Bytes big(1u << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7);
  store.set("big", big);
  CHECK(store.get("big") == big);

  // The prefix wrapper works over the TCP store too.
  auto shared = std::make_shared<TcpStore>(client_options(server.port()));
  PrefixStore prefixed("pg0", shared);
  prefixed.set("rank0", "addr");
  CHECK(store.get_string("pg0/rank0") == "addr");
  CHECK(server.rejected_clients() == 0);
}

TEST_CASE("tcp store: a host name is resolved", "[store]") {
  TcpStoreServer server(server_options());
  auto options = client_options(server.port());
  options.host = "localhost";
  TcpStore store(options);
  store.set("k", "v");
  CHECK(store.get_string("k") == "v");
}

TEST_CASE("tcp store: the server deletes the keys its owner names, and a waiter still sees a "
          "key written again",
          "[store]") {
  TcpStoreServer server(server_options());
  TcpStore store(client_options(server.port()));
  for (const char* key : {"old/a", "old/b", "new/a"}) store.set(key, "v");
  CHECK(server.delete_keys_if([](const std::string& key) { return key.starts_with("old/"); }) == 2);
  CHECK(store.num_keys() == 1);
  CHECK(store.get_string("new/a") == "v");
  std::thread writer([&] {
    TcpStore again(client_options(server.port()));
    again.set("old/a", "w");
  });
  CHECK(store.get_string("old/a") == "w");
  writer.join();
}

TEST_CASE("tcp store: get blocks until another client sets the key", "[store]") {
  TcpStoreServer server(server_options());
  TcpStore reader(client_options(server.port()));
  TcpStore writer(client_options(server.port()));
  std::atomic<bool> set_done{false};
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    // The server is not blocked by the pending get: other clients are served.
    writer.set("other", "x");
    set_done = writer.get_string("other") == "x";
    writer.set("late", "arrived");
  });
  CHECK(reader.get_string("late") == "arrived");
  CHECK(set_done);
  setter.join();
}

TEST_CASE("tcp store: wait returns once all its keys exist", "[store]") {
  TcpStoreServer server(server_options());
  TcpStore waiter(client_options(server.port()));
  TcpStore writer(client_options(server.port()));
  std::atomic<int> written{0};
  std::thread setter([&] {
    for (const char* key : {"k1", "k2", "k3"}) {
      std::this_thread::sleep_for(30ms);
      ++written;
      writer.set(key, "x");
    }
    // A key that appears, is deleted and comes back must still count.
  });
  waiter.wait({"k1", "k2", "k3"}, 30s);
  CHECK(written == 3);
  setter.join();

  writer.set("d", "1");
  CHECK(writer.delete_key("d"));
  std::thread later([&] {
    std::this_thread::sleep_for(50ms);
    writer.set("e", "1");
    writer.delete_key("e");
    writer.set("d", "2");
    std::this_thread::sleep_for(50ms);
    writer.set("e", "2");
  });
  waiter.wait({"d", "e"}, 30s);
  later.join();
  CHECK(waiter.get_string("e") == "2");
}

TEST_CASE("tcp store: a wait whose key is deleted after it counted it waits for it again",
          "[store]") {
  TcpStoreServer server(server_options());
  TcpStore waiter(client_options(server.port()));
  TcpStore writer(client_options(server.port()));
  writer.set("a", "1");
  std::atomic<bool> done{false};
  std::thread waiting([&] {
    waiter.wait({"a", "b", "b"}, 30s);
    done = true;
  });
  std::this_thread::sleep_for(50ms);  // (registered or not, "a" must be there at the end)
  CHECK(writer.delete_key("a"));
  writer.set("b", "1");
  std::this_thread::sleep_for(100ms);
  CHECK_FALSE(done);
  writer.set("a", "2");
  waiting.join();
  CHECK(done);
}

TEST_CASE("tcp store: many waits on many keys are answered as soon as the keys are set",
          "[store]") {
  // Every rank of a large job waits on every rank's key: each write must
  // cost its key's waiters, not all the keys they wait for (that made 1024
  // waits on 1024 keys take 100 s of the server's time).
  constexpr int kWaiters = 64;
  constexpr int kKeys = 2048;
  TcpStoreServer server(server_options());
  std::vector<std::string> keys;
  for (int i = 0; i < kKeys; ++i) keys.push_back(fmt::format("group/placement/1/{}", i));
  const std::string forever = proto::encode_i64(600'000);
  std::vector<std::string_view> wait_fields{forever};
  wait_fields.insert(wait_fields.end(), keys.begin(), keys.end());
  std::vector<std::unique_ptr<RawClient>> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.push_back(std::make_unique<RawClient>(server.port()));
    authenticate(*waiters.back());
    waiters.back()->send_frame(proto::MessageType::Wait, wait_fields);
  }
  TcpStore writer(client_options(server.port()));
  // Connected after the waits were sent (each fits one read): the server has
  // them all registered before the first set.
  for (const auto& key : keys) writer.set(key, "x");
  for (auto& waiter : waiters) {
    const auto reply = waiter->read_frame();
    REQUIRE(reply.has_value());
    CHECK(reply->type == proto::MessageType::Ok);
  }
  // Each wait's keys looked at when it registered and once more when its last
  // key came; a rescan per write would be about kKeys / 2 times as many.
  CHECK(server.stats().wait_key_checks <= int64_t{2} * kWaiters * kKeys);
}

TEST_CASE("tcp store: get and wait time out with StoreTimeout naming keys and address", "[store]") {
  TcpStoreServer server(server_options());
  TcpStore store(client_options(server.port()));
  const std::string address = store.address();

  store.set_timeout(100ms);
  CHECK_THROWS_AS(store.get("absent"), StoreTimeout);
  CHECK_THAT(error_of([&] { store.get("absent"); }),
             Catch::Contains("'absent'") && Catch::Contains(address));

  store.set("here", "1");
  const auto message = error_of([&] { store.wait({"here", "gone1", "gone2"}, 100ms); });
  CHECK_THAT(message, Catch::Contains("missing: 'gone1', 'gone2'") && Catch::Contains(address));
  CHECK_THROWS_AS(store.wait({"gone1"}, 0ms), StoreTimeout);

  // The connection is still in step after the timeouts.
  store.set("after", "ok");
  CHECK(store.get_string("after") == "ok");
  CHECK(store.num_keys() == 2);
}

TEST_CASE("tcp store: a get timeout of 0 leaves the calls that do not wait working", "[store]") {
  TcpStoreServer server(server_options());
  TcpStore store(client_options(server.port()));
  store.set_timeout(0ms);  // get as a try-get

  // A value big enough that the server cannot take it at once.
  const Bytes big(8u << 20, 7);
  store.set("big", big);
  for (int i = 0; i < 20; ++i) store.add("counter", 1);
  CHECK(store.compare_set("swap", {}, to_bytes("b")) == to_bytes("b"));
  CHECK(store.delete_key("swap"));
  CHECK(store.num_keys() == 2);
  CHECK_THROWS_AS(store.get("absent"), StoreTimeout);
  CHECK(store.get("big") == big);
  CHECK(store.get_string("counter") == "20");
}

TEST_CASE("tcp store: hundreds of concurrent clients add to one counter exactly", "[store]") {
  TcpStoreServer server(server_options());
  constexpr int kThreads = 16, kClientsPerThread = 16, kAddsPerClient = 10;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  std::mutex error_mutex;
  std::string first_error;  // Catch2 assertions are not thread-safe: collect, check after
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        std::vector<std::unique_ptr<TcpStore>> clients;
        for (int c = 0; c < kClientsPerThread; ++c) {
          clients.push_back(std::make_unique<TcpStore>(client_options(server.port())));
        }
        for (int i = 0; i < kAddsPerClient; ++i) {
          for (int c = 0; c < kClientsPerThread; ++c) {
            clients[c]->add("counter", t * kClientsPerThread + c + 1);
          }
        }
        // Every client also blocks on a key set only once all have added.
        clients[0]->add("done", 1);
        clients[1]->get("go");
      } catch (const std::exception& e) {
        std::lock_guard lock(error_mutex);
        if (failures++ == 0) first_error = e.what();
      }
    });
  }
  TcpStore main(client_options(server.port()));
  CHECK(eventually([&] { return main.add("done", 0) + failures == kThreads; }, 120s));
  main.set("go", "now");
  for (auto& t : threads) t.join();
  INFO(first_error);
  CHECK(failures == 0);
  const int64_t n = kThreads * kClientsPerThread;
  CHECK(main.add("counter", 0) == kAddsPerClient * n * (n + 1) / 2);
}

TEST_CASE("tcp store: calls from several threads on one client are serialised", "[store]") {
  TcpStoreServer server(server_options());
  TcpStore store(client_options(server.port()));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        store.add("n", 1);
        store.set(fmt::format("t{}", t), std::to_string(i));
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(store.add("n", 0) == 800);
  CHECK(store.get_string("t3") == "199");
}

TEST_CASE("tcp store: a process forked from the client's is refused its connection; the "
          "parent's goes on",
          "[store]") {
  // A forked data worker shares the client's socket: its get and the
  // parent's requests would receive each other's replies. It went through.
  TcpStoreServer server(server_options());
  TcpStore store(client_options(server.port()));
  store.set("k", "parent");
  const std::string message = lockstep::testing::error_in_forked_child([&] { store.get("k"); });
  CHECK_THAT(message, Catch::Contains("get in process") &&
                          Catch::Contains("forked from the one that connected") &&
                          Catch::Contains("make a TcpStore of the child's own"));
  // Before any call: gloo asks it first, under a lock a parent's thread may hold.
  CHECK_THAT(lockstep::testing::error_in_forked_child([&] { store.local_address(); }),
             Catch::Contains("local_address in process"));
  // A client of the child's own works.
  const std::string own = lockstep::testing::error_in_forked_child([&] {
    TcpStore child_store(client_options(server.port()));
    LOCKSTEP_CHECK(child_store.get_string("k") == "parent", "the child's own client read {}",
                   child_store.get_string("k"));
  });
  CHECK(own == "<no exception>");
  CHECK(store.get_string("k") == "parent");
  store.set("k2", "v");
  CHECK(store.get_string("k2") == "v");
}

TEST_CASE("tcp store: a wrong token is refused with a message about LOCKSTEP_TOKEN and about "
          "another job's store at the same address",
          "[store]") {
  TcpStoreServer server(server_options());
  auto options = client_options(server.port());
  options.token = "not-the-token";
  const auto message = error_of([&] { TcpStore store(options); });
  CHECK_THAT(message, Catch::Contains("token") && Catch::Contains("LOCKSTEP_TOKEN") &&
                          Catch::Contains(fmt::format("127.0.0.1:{}", server.port())));
  // The usual cause under torchrun and Slurm, whose tokens no one sets by hand.
  CHECK_THAT(message, Catch::Contains("another job's store") &&
                          Catch::Contains("give each job its own port"));
  CHECK(server.rejected_clients() == 1);
  // The right token still gets in.
  TcpStore good(client_options(server.port()));
  good.set("k", "v");
  CHECK(server.rejected_clients() == 1);
}

TEST_CASE("tcp store: connecting where nobody serves fails within connect_timeout", "[store]") {
  const uint16_t port = unused_port();
  auto options = client_options(port);
  options.connect_timeout = 500ms;
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    TcpStore store(options);
  } catch (const StoreTimeout& e) {
    message = e.what();
  }
  const auto elapsed = std::chrono::steady_clock::now() - start;
  CHECK_THAT(message, Catch::Contains(fmt::format("127.0.0.1:{}", port)) &&
                          Catch::Contains("could not connect"));
  CHECK(elapsed >= 500ms);
  CHECK(elapsed < 20s);  // bounded, not a hang
}

TEST_CASE("tcp store: a client given no port fails at once, not at the timeout", "[store]") {
  TcpStoreServer server(server_options());
  const auto start = std::chrono::steady_clock::now();
  const auto message = error_of([] {
    TcpStore store({.host = "127.0.0.1", .token = kToken, .connect_timeout = 5s});
  });
  CHECK_THAT(message, Catch::Contains("no port") && Catch::Contains("TcpStoreServer::port()"));
  CHECK(std::chrono::steady_clock::now() - start < 2s);
}

TEST_CASE("tcp store: a host name that does not exist fails at once, not at the timeout",
          "[store]") {
  // The resolver's "no such name" is final (only EAI_AGAIN is retried): the
  // connect timeout here is a day, so only the final error can end this.
  auto options = client_options(1);
  options.host = "no-such-host.invalid";
  options.connect_timeout = std::chrono::hours(24);
  const std::string message = error_of([&] { TcpStore store(options); });
  CHECK_THAT(message, Catch::Contains("no-such-host.invalid:1") &&
                          Catch::Contains("every rank can resolve"));
  // MASTER_ADDR exported by a script with Windows line endings: the name is
  // shown escaped, or its \r would send the cursor back over the message.
  options.host = "no-such-host.invalid\r";
  options.connect_timeout = 2s;
  const std::string crlf = error_of([&] { TcpStore store(options); });
  CHECK(crlf.find('\r') == std::string::npos);
  CHECK_THAT(crlf, Catch::Contains("cannot resolve host 'no-such-host.invalid\\r' (a carriage "
                                   "return"));
}

TEST_CASE("tcp store: after the server is gone, a call fails within seconds, not the connect "
          "timeout", "[store]") {
  auto server = std::make_unique<TcpStoreServer>(server_options());
  auto options = client_options(server->port());
  options.connect_timeout = 60s;  // the default
  TcpStore store(options);
  store.set("k", "v");
  server.reset();
  // The first call finds the connection broken; the next connects again,
  // briefly, to an address where nobody serves any more.
  CHECK_THAT(error_of([&] { store.set("k", "w"); }), Catch::Contains("set('k')"));
  const auto start = std::chrono::steady_clock::now();
  CHECK_THAT(error_of([&] { store.add("n", 1); }),
             Catch::Contains("could not connect to the lockstep store") &&
                 Catch::Contains("again after the connection was lost"));
  CHECK(std::chrono::steady_clock::now() - start < 30s);
}

TEST_CASE("tcp store: a client waiting for a server that took the connection but does not answer "
          "hears give_up", "[store]") {
  // A listener that never serves (a store server stopped in a debugger): the
  // kernel completes the connection and the AUTH frame waits unread.
  uint16_t port = 0;
  const int silent = loopback_listener(port);

  auto options = client_options(port);
  options.connect_timeout = 20s;
  const auto start = std::chrono::steady_clock::now();
  options.give_up = [&] {
    return std::chrono::steady_clock::now() - start > 300ms ? "told to stop" : "";
  };
  const auto message = error_of([&] { TcpStore store(options); });
  const auto took = std::chrono::steady_clock::now() - start;
  close(silent);
  CHECK_THAT(message, Catch::Contains("told to stop") && Catch::Contains("not answered"));
  CHECK(took < 3s);
}

namespace {

// A store server that stalls (stopped, or its host out of reach for a while):
// it takes the connection and answers AUTH, then answers the first request
// (a wait) only `stall` later, with TIMEOUT.
class StalledServer {
 public:
  explicit StalledServer(std::chrono::milliseconds stall) : listener_(loopback_listener(port_)) {
    thread_ = std::thread([this, stall] { serve(stall); });
  }
  ~StalledServer() {
    thread_.join();
    close(listener_);
  }
  uint16_t port() const { return port_; }

 private:
  void serve(std::chrono::milliseconds stall) {
    const int fd = accept(listener_, nullptr, nullptr);
    if (fd < 0) return;
    proto::FrameParser parser(1 << 20);
    for (int answered = 0; answered < 2;) {
      char buffer[4096];
      const ssize_t n = recv(fd, buffer, sizeof buffer, 0);
      if (n <= 0) break;
      parser.feed(buffer, static_cast<size_t>(n));
      for (proto::Frame frame; parser.next(frame) == proto::FrameParser::Status::Frame;) {
        if (frame.type == proto::MessageType::Auth) {
          send_frame(fd, proto::MessageType::Ok, {});
        } else {
          std::this_thread::sleep_for(stall);
          send_frame(fd, proto::MessageType::Timeout, {"k"});
        }
        ++answered;
      }
    }
    close(fd);
  }
  static void send_frame(int fd, proto::MessageType type,
                         const std::vector<std::string_view>& fields) {
    const auto bytes = proto::encode_frame(type, fields);
    (void)!send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);  // the client may be gone
  }

  uint16_t port_ = 0;  // before listener_, which sets it
  int listener_ = -1;
  std::thread thread_;
};

// What a wait of 100 ms on a server stalled for 1 s throws, given `grace`.
std::string wait_on_stalled_server(std::chrono::milliseconds grace) {
  StalledServer server(1s);
  auto options = client_options(server.port());
  options.reply_grace = grace;
  TcpStore store(options);
  try {
    store.wait({"k"}, 100ms);
  } catch (const StoreUnreachable& e) {
    return std::string("unreachable: ") + e.what();
  } catch (const StoreTimeout& e) {
    return std::string("answered: ") + e.what();
  }
  return "returned";
}

}  // namespace

TEST_CASE("tcp store: reply_grace is how long a client waits for a stalled server's answer",
          "[store]") {
  // Longer than the stall: the server's TIMEOUT arrives and is the answer.
  CHECK_THAT(wait_on_stalled_server(5s),
             Catch::StartsWith("answered: timed out after 100 ms waiting for key(s) 'k'"));
  // Shorter: the client stops waiting and calls the server unreachable.
  CHECK_THAT(wait_on_stalled_server(200ms),
             Catch::StartsWith("unreachable: ") && Catch::Contains("no reply to wait('k')") &&
                 Catch::Contains("stuck or overloaded"));
}

TEST_CASE("tcp store: a call waiting for a stalled server's answer hears give_up", "[store]") {
  // A launcher told to stop by a signal while node 0's store answers
  // nothing: its call ends then, not after the timeout and the reply grace.
  StalledServer server(3s);
  auto options = client_options(server.port());
  options.reply_grace = std::chrono::hours(1);
  std::atomic<bool> told{false};
  options.give_up = [&] { return told ? std::string("received SIGTERM") : std::string(); };
  TcpStore store(options);
  std::thread teller([&] {
    std::this_thread::sleep_for(300ms);
    told = true;
  });
  std::string outcome;
  try {
    store.wait({"k"}, std::chrono::hours(1));
    outcome = "returned";
  } catch (const StoreTimeout& e) {
    outcome = std::string("stopped: ") + e.what();
  } catch (const std::exception& e) {
    outcome = std::string("failed: ") + e.what();
  }
  teller.join();
  CHECK_THAT(outcome, Catch::StartsWith("stopped: ") &&
                          Catch::Contains("stopped waiting for the answer to wait('k') "
                                          "(received SIGTERM)"));
}

TEST_CASE("tcp store: a client started before the server connects once it is up", "[store]") {
  const uint16_t port = unused_port();
  std::unique_ptr<TcpStoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(200ms);
    auto options = server_options();
    options.port = port;
    server = std::make_unique<TcpStoreServer>(options);
  });
  TcpStore store(client_options(port));
  starter.join();
  store.set("k", "v");
  CHECK(store.get_string("k") == "v");
}

TEST_CASE("tcp store: malformed input drops only that client; the server carries on", "[store]") {
  auto options = server_options();
  options.max_frame_bytes = 4096;
  TcpStoreServer server(options);
  int64_t expected_rejects = 0;

  SECTION("garbage bytes") {
    RawClient raw(server.port());
    raw.send_bytes({'G', 'E', 'T', ' ', '/', ' ', 'H', 'T', 'T', 'P', '\r', '\n', 0, 0xff});
    CHECK(raw.closed_by_server());
    expected_rejects = 1;
  }
  SECTION("garbage after a good AUTH") {
    RawClient raw(server.port());
    authenticate(raw);
    std::vector<uint8_t> junk(1000);
    for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<uint8_t>(i * 31 + 7);
    raw.send_bytes(junk);
    CHECK(raw.closed_by_server());
    expected_rejects = 1;
  }
  SECTION("a length over the limit") {
    RawClient raw(server.port());
    authenticate(raw);
    std::vector<uint8_t> header = {'L', 'K', 'S', '1', 2, 0xff, 0xff, 0xff, 0x7f};
    raw.send_bytes(header);
    CHECK(raw.closed_by_server());
    expected_rejects = 1;
  }
  SECTION("a frame cut mid-way, then a disconnect") {
    RawClient raw(server.port());
    authenticate(raw);
    auto frame = proto::encode_frame(proto::MessageType::Set, {"cut", "value"});
    frame.resize(frame.size() - 3);
    raw.send_bytes(frame);
    std::this_thread::sleep_for(50ms);
    raw.close_now();
    expected_rejects = 1;
  }
  SECTION("a request before AUTH") {
    RawClient raw(server.port());
    raw.send_frame(proto::MessageType::Set, {"sneaky", "1"});
    CHECK(raw.closed_by_server());
    expected_rejects = 1;
  }
  SECTION("a reply frame sent as a request") {
    RawClient raw(server.port());
    authenticate(raw);
    raw.send_frame(proto::MessageType::Ok, {});
    CHECK(raw.closed_by_server());
    expected_rejects = 1;
  }
  SECTION("a client that hangs up during a pending get is not an error") {
    RawClient raw(server.port());
    authenticate(raw);
    raw.send_frame(proto::MessageType::Get, {"never", proto::encode_i64(60000)});
    std::this_thread::sleep_for(50ms);
    raw.close_now();
    expected_rejects = 0;
  }
  SECTION("a value over the limit from a real client") {
    // Refused by the client, which says why; its connection stays up.
    TcpStore store(client_options(server.port()));
    const std::string error = error_of([&] { store.set("big", Bytes(8192)); });
    CHECK_THAT(error, Catch::Contains(fmt::format("127.0.0.1:{}", server.port())) &&
                          Catch::Contains("set('big')") &&
                          Catch::Contains("over the 4096 bytes the server takes"));
    CHECK_THAT(error_of([&] { store.wait(std::vector<std::string>(600, std::string(8, 'k'))); }),
               Catch::Contains("over the 4096 bytes"));
    store.set("small", "ok");
    CHECK(store.get_string("small") == "ok");
    CHECK(server.stats().connections == 1);
    expected_rejects = 0;
  }

  CHECK(eventually([&] { return server.rejected_clients() == expected_rejects; }));
  TcpStore normal(client_options(server.port()));
  normal.set("still", "serving");
  CHECK(normal.get_string("still") == "serving");
  CHECK_FALSE(normal.delete_key("sneaky"));  // the unauthenticated SET did nothing
  CHECK(server.rejected_clients() == expected_rejects);
}

TEST_CASE("tcp store: pipelined requests are answered in order", "[store]") {
  TcpStoreServer server(server_options());
  RawClient raw(server.port());
  std::vector<uint8_t> batch;
  proto::append_frame(batch, proto::MessageType::Auth, {kToken});
  proto::append_frame(batch, proto::MessageType::Set, {"p", "1"});
  proto::append_frame(batch, proto::MessageType::Add, {"n", proto::encode_i64(5)});
  proto::append_frame(batch, proto::MessageType::Get, {"p", proto::encode_i64(1000)});
  proto::append_frame(batch, proto::MessageType::NumKeys, {});
  raw.send_bytes(batch);
  std::vector<proto::Frame> replies;
  for (int i = 0; i < 5; ++i) {
    auto reply = raw.read_frame();
    REQUIRE(reply.has_value());
    REQUIRE(reply->type == proto::MessageType::Ok);
    replies.push_back(*reply);
  }
  CHECK(proto::decode_i64(replies[2].fields.at(0)) == 5);
  CHECK(replies[3].fields.at(0) == "1");
  CHECK(proto::decode_i64(replies[4].fields.at(0)) == 2);
}

TEST_CASE("tcp store: a stopped server makes calls fail naming the address", "[store]") {
  auto server = std::make_unique<TcpStoreServer>(server_options());
  auto options = client_options(server->port());
  options.connect_timeout = 300ms;
  TcpStore store(options);
  store.set("k", "v");
  server.reset();
  CHECK_THAT(error_of([&] { store.get("k"); }),
             Catch::Contains(fmt::format("127.0.0.1:{}", options.port)));
}
