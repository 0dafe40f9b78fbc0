// TcpStore: the client side of the TCP store. One connection, one request at
// a time (calls are serialised by a mutex); every socket operation waits in
// poll() against a deadline, so no call blocks past its timeout.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "lockstep/runtime/env.h"
#include "lockstep/runtime/liveness.h"
#include "lockstep/runtime/process_id.h"
#include "lockstep/distributed/store/detail/protocol.h"
#include "lockstep/distributed/store/listen_address.h"
#include "lockstep/distributed/store/tcp_store.h"

namespace lockstep::distributed {

namespace proto = store_protocol;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

constexpr milliseconds kFirstBackoff{10};
constexpr milliseconds kMaxBackoff{1000};
// Connecting again after the server broke the connection: a server still
// there takes it at once; a gone one (its host down, its process ended) must
// not hold the caller for the whole connect timeout.
constexpr milliseconds kReconnectTimeout = std::chrono::seconds(2);
// The least a request that does not wait waits for its answer.
constexpr milliseconds kLeastAnswerWait = std::chrono::seconds(2);
// A wait within one connect attempt (a SYN a firewall drops, the AUTH reply
// of a server that accepted but does not answer: stopped in a debugger), and
// a call's wait for its answer when give_up is set, is cut into slices of
// this, so that give_up and the waiting report are heard during it too.
constexpr milliseconds kWaitSlice{100};
constexpr int64_t kMaxTimeoutMs = int64_t{100} * 365 * 24 * 3600 * 1000;

Clock::time_point deadline_after(milliseconds timeout) {
  return Clock::now() + milliseconds(std::clamp<int64_t>(timeout.count(), 0, kMaxTimeoutMs));
}

// For GET and WAIT: the server answers TIMEOUT at `timeout`; wait `grace`
// longer for that answer. (Clamped first: milliseconds::max() + grace overflows.)
Clock::time_point reply_deadline(milliseconds timeout, milliseconds grace) {
  return deadline_after(std::min(timeout, milliseconds(kMaxTimeoutMs)) +
                        std::clamp(grace, milliseconds(0), milliseconds(kMaxTimeoutMs)));
}

// For a request that does not wait (SET, ADD, ...), answered at once: timeout()
// is how long get and wait wait for keys, and a short one (0 makes get a
// try-get) must not fail a set or an add that the server has applied.
Clock::time_point answer_deadline(milliseconds timeout) {
  return deadline_after(std::max(timeout, kLeastAnswerWait));
}

// Milliseconds left until `deadline` for poll(): 0 when past, capped to fit an int.
int poll_ms(Clock::time_point deadline) {
  auto ms = std::chrono::ceil<milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 3'600'000));
}

std::string quoted_list(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& key : keys) out += (out.empty() ? "'" : ", '") + key + "'";
  return out;
}

std::string_view view(const Bytes& bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

Bytes bytes_of(const std::string& text) { return Bytes(text.begin(), text.end()); }

}  // namespace

struct TcpStore::Impl {
  TcpStoreOptions options;
  std::string address;  // "host:port", for messages
  std::string local;    // this end's IP, from getsockname
  int fd = -1;
  // Why the server broke the last connection (lost()); empty when none did.
  std::string lost_cause;
  // The largest request body the server takes, from its AUTH reply; 0: not said.
  uint64_t max_body = 0;
  std::mutex mutex;
  proto::FrameParser parser{0xffffffffu};
  pid_t maker_pid = runtime::this_process_id();

  explicit Impl(TcpStoreOptions opts) : options(std::move(opts)) {
    const bool v6 = options.host.find(':') != std::string::npos;
    const std::string host = runtime::escape_controls(options.host);
    address = v6 ? fmt::format("[{}]:{}", host, options.port)
                 : fmt::format("{}:{}", host, options.port);
  }
  ~Impl() { disconnect(); }

  void disconnect() {
    if (fd >= 0) close(fd);
    fd = -1;
    parser = proto::FrameParser(0xffffffffu);
  }

  void connect_with_backoff(milliseconds timeout);
  std::optional<int> try_connect(Clock::time_point deadline, std::string& error,
                                 const std::function<void()>& between_slices);
  enum class Sent { All, TimedOut, Failed };
  Sent try_send_all(const std::vector<uint8_t>& bytes, Clock::time_point deadline,
                    std::string& error);
  void send_all(const std::vector<uint8_t>& bytes, Clock::time_point deadline,
                const std::string& what);
  std::optional<proto::Frame> read_frame(Clock::time_point deadline, const std::string& what);
  proto::Frame call(proto::MessageType type, const std::vector<std::string_view>& fields,
                    Clock::time_point deadline, const std::string& what);
  [[noreturn]] void lost(const std::string& what, const std::string& cause);
  // The connection, for one request of `op`; refused in a process forked
  // from the one that made it.
  std::unique_lock<std::mutex> use(std::string_view op);
};

// A forked child shares its parent's socket: their requests and replies
// would cross, and a get could return the value of the parent's request.
std::unique_lock<std::mutex> TcpStore::Impl::use(std::string_view op) {
  if (runtime::this_process_id() != maker_pid) {
    throw Error(fmt::format(
        "lockstep store at {}: {} in process {}, which was forked from the one that connected "
        "(pid {}): the two would share one connection and receive each other's replies; make "
        "a TcpStore of the child's own (same host, port and token), or start the child with "
        "lockstep::spawn or lockstep-run",
        address, op, ::getpid(), maker_pid));
  }
  return std::unique_lock<std::mutex>(mutex);
}

// One connection attempt to each address `host` resolves to; a non-blocking
// connect so that an unreachable host cannot hold us past the deadline.
std::optional<int> TcpStore::Impl::try_connect(Clock::time_point deadline, std::string& error,
                                               const std::function<void()>& between_slices) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc =
      getaddrinfo(options.host.c_str(), std::to_string(options.port).c_str(), &hints, &found);
  if (rc != 0) {
    error = fmt::format("cannot resolve host {}: {}", runtime::quoted_value(options.host),
                        gai_strerror(rc));
    // A name the resolver says does not exist will not appear by waiting;
    // only a temporary failure (EAI_AGAIN) is worth retrying.
    LOCKSTEP_CHECK(rc != EAI_NONAME && rc != EAI_FAIL,
                   "cannot reach the lockstep store at {}: {}. The store's host must be a name "
                   "or address every rank can resolve (set MASTER_ADDR, or LOCKSTEP_STORE_ADDR, "
                   "to one)",
                   address, error);
    return std::nullopt;
  }
  std::optional<int> connected;
  // Loopback that no attempt could even route to: this machine's `lo` is
  // down, which waiting will not change (the server not being up yet is a
  // refusal instead).
  bool loopback_down = names_loopback(options.host);
  for (addrinfo* ai = found; ai != nullptr && !connected; ai = ai->ai_next) {
    const int s = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) {
      error = strerror(errno);
      loopback_down = false;  // no socket (out of descriptors?): nothing learned of `lo`
      continue;
    }
    int rc2 = connect(s, ai->ai_addr, ai->ai_addrlen);
    if (rc2 < 0 && (errno == EINPROGRESS || errno == EINTR)) {
      pollfd p{s, POLLOUT, 0};
      int ready;
      while (true) {
        ready = poll(&p, 1, poll_ms(std::min(deadline, Clock::now() + kWaitSlice)));
        if (ready < 0 && errno == EINTR) continue;
        if (ready != 0 || Clock::now() >= deadline) break;
        error = "the connection is not answered yet";
        try {
          between_slices();
        } catch (...) {
          close(s);
          freeaddrinfo(found);
          throw;
        }
      }
      int so_error = ETIMEDOUT;
      socklen_t len = sizeof so_error;
      if (ready > 0) getsockopt(s, SOL_SOCKET, SO_ERROR, &so_error, &len);
      rc2 = so_error == 0 ? 0 : -1;
      errno = so_error;
    }
    if (rc2 == 0) {
      connected = s;
    } else {
      if (errno != ENETUNREACH && errno != EADDRNOTAVAIL) loopback_down = false;
      error = strerror(errno);
      close(s);
    }
  }
  freeaddrinfo(found);
  // Unroutable with `lo` up is no free ephemeral port (EADDRNOTAVAIL), which
  // frees up as connections close: retried like any other failure.
  LOCKSTEP_CHECK(connected || !loopback_down || loopback_interface_up(),
                 "cannot reach the lockstep store at {}: {}: this machine's loopback interface "
                 "is down (as in a network namespace of its own, e.g. `unshare -n` or a "
                 "container started without networking); bring it up (`ip link set lo up`) or "
                 "give the store an address on an interface that is up (MASTER_ADDR)",
                 address, error);
  return connected;
}

/*
 * Connecting: the server may not be up yet (rank 0 still starting), or may
 * turn connections away as busy for a while, so each failed attempt sleeps and
 * retries, the sleep doubling from 10 ms to 1 s with some jitter (hundreds of
 * ranks do not retry in step), until `timeout` (connect_timeout, or
 * kReconnectTimeout after the server broke a connection). A connection is ready
 * once the server has accepted our AUTH frame; a refused token is final and
 * not retried.
 */
void TcpStore::Impl::connect_with_backoff(milliseconds timeout) {
  const std::string broken_by = lost_cause;  // for the message; attempts may overwrite it
  const auto started = Clock::now();
  const auto deadline = deadline_after(timeout);
  auto next_report = started + options.report_waiting_every;
  std::minstd_rand jitter(static_cast<unsigned>(Clock::now().time_since_epoch().count()));
  milliseconds backoff = kFirstBackoff;
  std::string error = "timed out";
  bool busy = false;  // the last attempt was turned away as busy
  int attempts = 0;
  const auto stop_if_told = [&] {
    if (!options.give_up) return;
    if (const std::string why = options.give_up(); !why.empty())
      throw StoreTimeout(fmt::format("stopped connecting to the lockstep store at {} after {} "
                                     "attempts ({}; last error: {})",
                                     address, attempts, why, error));
  };
  const auto report_if_due = [&] {
    const auto now = Clock::now();
    if (options.report_waiting_every.count() <= 0 || now < next_report) return;
    using Seconds = std::chrono::duration<double>;
    fmt::print(stderr, "lockstep: {} has been connecting to the store at {} for {:.1f} s; "
               "still trying until the connect timeout ({:.0f} s). Last error: {}\n",
               options.who.empty() ? "this process" : options.who, address,
               Seconds(now - started).count(), Seconds(options.connect_timeout).count(), error);
    std::fflush(stderr);
    next_report = now + options.report_waiting_every;
  };
  const std::function<void()> between_slices = [&] {
    stop_if_told();
    report_if_due();
  };
  while (true) {
    ++attempts;
    busy = false;
    if (auto s = try_connect(deadline, error, between_slices)) {
      fd = *s;
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      // The AUTH reply gets the rest of the connect time, at least a second.
      const auto auth_deadline = std::max(deadline, Clock::now() + std::chrono::seconds(1));
      std::optional<std::string> refused;
      try {
        // A server that turns us away replies and closes at once, so our send
        // may fail; its reply is still there to read.
        std::string send_error;
        try_send_all(proto::encode_frame(proto::MessageType::Auth, {options.token}),
                     auth_deadline, send_error);
        std::optional<proto::Frame> reply;
        while (!(reply = read_frame(std::min(auth_deadline, Clock::now() + kWaitSlice),
                                    "authenticating")) &&
               Clock::now() < auth_deadline) {
          error = "the server took the connection but has not answered yet";
          between_slices();
        }
        if (reply && reply->type == proto::MessageType::Ok) {
          const bool said = reply->fields.size() == 1 && reply->fields[0].size() == 8;
          max_body = said ? static_cast<uint64_t>(proto::decode_i64(reply->fields[0])) : 0;
          break;
        }
        if (reply && reply->type == proto::MessageType::Error && !reply->fields.empty()) {
          if (reply->fields[0].starts_with(proto::kBusyPrefix)) {
            busy = true;
            error = fmt::format("the server turned the connection away: {}",
                                reply->fields[0].substr(proto::kBusyPrefix.size()));
          } else {
            refused = reply->fields[0];
          }
        } else {
          error = reply ? "unexpected reply to AUTH"
                        : (send_error.empty() ? "no reply to AUTH" : send_error);
        }
      } catch (const StoreTimeout&) {  // told to stop
        disconnect();
        throw;
      } catch (const Error& e) {
        error = e.what();  // e.g. the server closed the connection: retry
      }
      disconnect();
      if (refused) {
        throw Error(fmt::format(
            "the lockstep store at {} refused this process's token ({}). Either that address "
            "is another job's store (two jobs given the same MASTER_ADDR:MASTER_PORT or "
            "LOCKSTEP_STORE_ADDR; under torchrun and Slurm each job's token differs): give each "
            "job its own port; or this job's processes disagree on the token: lockstep-run sets "
            "LOCKSTEP_TOKEN for the ranks it starts; when starting ranks another way, give "
            "every rank (and the store server) the same LOCKSTEP_TOKEN",
            address, *refused));
      }
    }
    stop_if_told();
    const auto now = Clock::now();
    if (now >= deadline) {
      const std::string advice =
          busy ? "The server is up but serves no more connections: close clients of it that "
                 "are not needed (see the server's log for who holds them)"
               : "Check that the store server (rank 0, or lockstep-run) is running and "
                 "reachable there, and that the address (LOCKSTEP_STORE_ADDR, or MASTER_ADDR "
                 "and MASTER_PORT) names it";
      const std::string again =
          broken_by.empty() ? "" : fmt::format(" again after the connection was lost ({})",
                                               broken_by);
      throw StoreUnreachable(
          fmt::format("could not connect to the lockstep store at {}{} within {} ms ({} "
                      "attempts; last error: {}). {}",
                      address, again, timeout.count(), attempts, error, advice));
    }
    report_if_due();
    const auto sleep = std::min<Clock::duration>(
        backoff + milliseconds(jitter() % (backoff.count() / 2 + 1)), deadline - now);
    std::this_thread::sleep_for(sleep);
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  char host[NI_MAXHOST] = "";
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof host, nullptr, 0,
                NI_NUMERICHOST);
  }
  local = host;
  lost_cause.clear();
}

void TcpStore::Impl::lost(const std::string& what, const std::string& cause) {
  disconnect();
  lost_cause = cause;
  throw Error(
      fmt::format("lockstep store at {}: {} failed: {}. Did the store server (rank 0, "
                  "or lockstep-run) exit?",
                  address, what, cause));
}

TcpStore::Impl::Sent TcpStore::Impl::try_send_all(const std::vector<uint8_t>& bytes,
                                                   Clock::time_point deadline,
                                                   std::string& error) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n >= 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      error = strerror(errno);
      return Sent::Failed;
    }
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, poll_ms(deadline)) == 0) {
      error = "the server took no data before the timeout";
      return Sent::TimedOut;
    }
  }
  return Sent::All;
}

void TcpStore::Impl::send_all(const std::vector<uint8_t>& bytes, Clock::time_point deadline,
                              const std::string& what) {
  std::string error;
  switch (try_send_all(bytes, deadline, error)) {
    case Sent::All: return;
    case Sent::Failed: lost(what, error);
    case Sent::TimedOut:
      disconnect();
      lost_cause = "the server took no data";
      throw StoreUnreachable(
          fmt::format("lockstep store at {}: {}: the server took no data before "
                      "the timeout; it may be stuck or overloaded",
                      address, what));
  }
}

// The next reply frame, or nullopt when `deadline` passes first.
std::optional<proto::Frame> TcpStore::Impl::read_frame(Clock::time_point deadline,
                                                       const std::string& what) {
  proto::Frame frame;
  char buffer[64 << 10];
  while (true) {
    const auto status = parser.next(frame);
    if (status == proto::FrameParser::Status::Frame) return frame;
    if (status == proto::FrameParser::Status::Error) {
      lost(what,
           fmt::format("garbled reply ({}); is that address a lockstep store?", parser.message()));
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, poll_ms(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      if (Clock::now() >= deadline) return std::nullopt;
      continue;  // poll_ms capped the wait
    }
    const ssize_t n = recv(fd, buffer, sizeof buffer, 0);
    if (n > 0) {
      parser.feed(buffer, static_cast<size_t>(n));
    } else if (n == 0) {
      lost(what, "the server closed the connection");
    } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      lost(what, strerror(errno));
    }
  }
}

// Sends one request and returns its reply; ERROR replies become
// lockstep::Error. Reconnects first when an earlier call broke the connection
// (within kReconnectTimeout when the server broke it).
proto::Frame TcpStore::Impl::call(proto::MessageType type,
                                  const std::vector<std::string_view>& fields,
                                  Clock::time_point deadline, const std::string& what) {
  if (fd < 0)
    connect_with_backoff(lost_cause.empty() ? options.connect_timeout
                                            : std::min(options.connect_timeout, kReconnectTimeout));
  // A request over the server's limit would make it drop this connection, and
  // the caller would hear only that the connection broke.
  uint64_t body = 0;
  for (std::string_view field : fields) body += 4 + field.size();
  if (max_body > 0 && body > max_body) {
    throw Error(fmt::format(
        "lockstep store at {}: {}: the request is {} bytes, over the {} bytes the server takes "
        "in one request; keep large data out of the store (write it to a file and store the "
        "file's path, or send it with a collective)",
        address, what, body, max_body));
  }
  const auto request = proto::encode_frame(type, fields);
  send_all(request, deadline, what);
  // Heard out in slices when give_up may end the wait (a launcher told to stop).
  const auto slice_end = [&] {
    return options.give_up ? std::min(deadline, Clock::now() + kWaitSlice) : deadline;
  };
  auto reply = read_frame(slice_end(), what);
  while (!reply && Clock::now() < deadline) {
    if (const std::string why = options.give_up(); !why.empty()) {
      // The answer may still come, out of step with the next request's.
      disconnect();
      lost_cause = fmt::format("stopped waiting for the answer to {}", what);
      throw StoreTimeout(fmt::format("lockstep store at {}: stopped waiting for the answer to {} "
                                     "({})",
                                     address, what, why));
    }
    reply = read_frame(slice_end(), what);
  }
  if (!reply) {
    // The stream is out of step now (the reply may still come): start afresh,
    // within kReconnectTimeout as after a broken connection.
    disconnect();
    lost_cause = fmt::format("no reply to {}", what);
    throw StoreUnreachable(
        fmt::format("lockstep store at {}: no reply to {}; the server may be "
                    "stuck or overloaded",
                    address, what));
  }
  if (reply->type == proto::MessageType::Error) {
    throw Error(fmt::format("lockstep store at {}: {}: {}", address, what, reply->fields.at(0)));
  }
  return std::move(*reply);
}

TcpStore::TcpStore(TcpStoreOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  // Port 0 has a server pick one; a client given it (left unset) would retry
  // a refused connection until its connect timeout.
  LOCKSTEP_CHECK(impl_->options.port != 0,
                 "TcpStore: no port for the store at {} (port 0 names no server); give the port "
                 "the server listens on (TcpStoreServer::port() when it was made with port 0)",
                 impl_->options.host);
  set_timeout(impl_->options.timeout);
  impl_->connect_with_backoff(impl_->options.connect_timeout);
}

TcpStore::~TcpStore() = default;

namespace {

// Checks a reply has the expected shape; anything else means a confused server.
const proto::Frame& expect_ok(const proto::Frame& reply, size_t fields, const std::string& address,
                              const std::string& what) {
  if (reply.type != proto::MessageType::Ok || reply.fields.size() != fields) {
    throw Error(fmt::format("lockstep store at {}: unexpected {} reply with {} fields to {}",
                            address, proto::type_name(reply.type), reply.fields.size(), what));
  }
  return reply;
}

int64_t int_field(const proto::Frame& reply, const std::string& address, const std::string& what) {
  expect_ok(reply, 1, address, what);
  LOCKSTEP_CHECK(reply.fields[0].size() == 8, "lockstep store at {}: malformed reply to {}",
                 address, what);
  return proto::decode_i64(reply.fields[0]);
}

}  // namespace

void TcpStore::set(const std::string& key, const Bytes& value) {
  const auto lock = impl_->use("set");
  const std::string what = fmt::format("set('{}')", key);
  expect_ok(
      impl_->call(proto::MessageType::Set, {key, view(value)}, answer_deadline(timeout()), what), 0,
      impl_->address, what);
}

Bytes TcpStore::get(const std::string& key) {
  const runtime::BusyScope waiting_for_peers;  // not a hang (runtime/liveness.h)
  const auto lock = impl_->use("get");
  const std::string what = fmt::format("get('{}')", key);
  const milliseconds limit = timeout();
  auto reply = impl_->call(proto::MessageType::Get, {key, proto::encode_i64(limit.count())},
                           reply_deadline(limit, impl_->options.reply_grace), what);
  if (reply.type == proto::MessageType::Timeout) {
    throw StoreTimeout(fmt::format(
        "timed out after {} ms waiting for key '{}' in the lockstep store at {}; the rank that "
        "should set it may have failed or be slower than the timeout",
        limit.count(), key, impl_->address));
  }
  return bytes_of(expect_ok(reply, 1, impl_->address, what).fields[0]);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  const auto lock = impl_->use("add");
  const std::string what = fmt::format("add('{}', {})", key, delta);
  return int_field(impl_->call(proto::MessageType::Add, {key, proto::encode_i64(delta)},
                               answer_deadline(timeout()), what),
                   impl_->address, what);
}

Bytes TcpStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  const auto lock = impl_->use("compare_set");
  const std::string what = fmt::format("compare_set('{}')", key);
  auto reply = impl_->call(proto::MessageType::CompareSet, {key, view(expected), view(desired)},
                           answer_deadline(timeout()), what);
  return bytes_of(expect_ok(reply, 1, impl_->address, what).fields[0]);
}

void TcpStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  if (keys.empty()) return;
  LOCKSTEP_CHECK(keys.size() < proto::kMaxFields,
                 "TcpStore::wait on {} keys: at most {} keys per call; wait in batches",
                 keys.size(), proto::kMaxFields - 1);
  const runtime::BusyScope waiting_for_peers;
  const auto lock = impl_->use("wait");
  const std::string what = fmt::format("wait({})", quoted_list(keys));
  const std::string timeout_field = proto::encode_i64(timeout.count());
  std::vector<std::string_view> fields{timeout_field};
  fields.insert(fields.end(), keys.begin(), keys.end());
  auto reply = impl_->call(proto::MessageType::Wait, fields,
                           reply_deadline(timeout, impl_->options.reply_grace), what);
  if (reply.type == proto::MessageType::Timeout) {
    throw StoreTimeout(fmt::format(
        "timed out after {} ms waiting for key(s) {} in the lockstep store at {} (missing: "
        "{}); the rank that should set them may have failed or be slower than the timeout",
        timeout.count(), quoted_list(keys), impl_->address, quoted_list(reply.fields)));
  }
  expect_ok(reply, 0, impl_->address, what);
}

bool TcpStore::delete_key(const std::string& key) {
  const auto lock = impl_->use("delete_key");
  const std::string what = fmt::format("delete_key('{}')", key);
  return int_field(impl_->call(proto::MessageType::Delete, {key}, answer_deadline(timeout()), what),
                   impl_->address, what) != 0;
}

int64_t TcpStore::num_keys() {
  const auto lock = impl_->use("num_keys");
  return int_field(
      impl_->call(proto::MessageType::NumKeys, {}, answer_deadline(timeout()), "num_keys()"),
      impl_->address, "num_keys()");
}

std::string TcpStore::address() const { return impl_->address; }

std::string TcpStore::local_address() const {
  const auto lock = impl_->use("local_address");
  return impl_->local;
}

std::string random_token() {
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  unsigned char bytes[16] = {};
  urandom.read(reinterpret_cast<char*>(bytes), sizeof bytes);
  LOCKSTEP_CHECK(urandom.good(), "cannot read /dev/urandom for the store token; set "
                 "LOCKSTEP_TOKEN to a secret string instead");
  std::string hex;
  for (unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

}  // namespace lockstep::distributed
