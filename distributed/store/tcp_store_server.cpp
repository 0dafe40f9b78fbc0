// TcpStoreServer: the store's data and one epoll event loop serving every
// client from a background thread. What it holds back (connection caps,
// repeated warnings) is counted in server_limits.h; how it starts listening,
// in server_setup.h.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "lockstep/distributed/store/detail/protocol.h"
#include "lockstep/distributed/store/detail/server_limits.h"
#include "lockstep/distributed/store/detail/server_setup.h"
#include "lockstep/distributed/store/tcp_store.h"

namespace lockstep::distributed {

namespace proto = store_protocol;
using Clock = std::chrono::steady_clock;

namespace {

// A client must authenticate this soon after connecting, or it is dropped.
constexpr auto kAuthTimeout = std::chrono::seconds(60);
// Out of descriptors, accept() is retried this often (not spun on).
constexpr auto kAcceptRetry = std::chrono::milliseconds(100);
// A warning that repeats (failed accepts, refused connections) is written at
// most this often, with a count of what was held back.
constexpr auto kWarningInterval = std::chrono::seconds(10);
// Past this much unsent reply data a connection's requests wait for its reader.
constexpr size_t kOutputHighWater = 4u << 20;
constexpr size_t kReadChunk = 64u << 10;
// A GET reply's value at least this big is sent from the stored value itself,
// not copied: many clients reading one big value must not hold a copy each.
constexpr size_t kShareValueBytes = 64u << 10;
// A timeout beyond this (e.g. milliseconds::max()) means "forever" and must
// not overflow the clock.
constexpr int64_t kMaxTimeoutMs = int64_t{100} * 365 * 24 * 3600 * 1000;

// A stored value: immutable, so that replies in flight can share it.
using Value = std::shared_ptr<const std::string>;

Value make_value(std::string text) { return std::make_shared<const std::string>(std::move(text)); }

// Part of what a connection still has to send: bytes of its own (replies
// appended back to back), or a stored value shared with the store.
struct OutPiece {
  std::vector<uint8_t> own;
  Value shared;
  size_t sent = 0;

  size_t size() const { return shared ? shared->size() : own.size(); }
  const void* at_sent() const {
    return shared ? static_cast<const void*>(shared->data() + sent)
                  : static_cast<const void*>(own.data() + sent);
  }
};

struct Peer {
  std::string address;  // the IP, what connection caps count by
  std::string name;     // "ip:port", for messages
};

Peer peer_of(const sockaddr_storage& addr, socklen_t len) {
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof host, port,
                  sizeof port, NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return {"<unknown peer>", "<unknown peer>"};
  }
  return {host, addr.ss_family == AF_INET6 ? fmt::format("[{}]:{}", host, port)
                                           : fmt::format("{}:{}", host, port)};
}

void log_line(const std::string& text) { fmt::print(stderr, "lockstep store server: {}\n", text); }

std::string held_back(uint64_t n, std::string_view what) {
  return n == 0 ? std::string() : fmt::format("; {} more {} since the last report", n, what);
}

/*
 * One connection. Requests are handled one at a time, in order: while a GET or
 * WAIT is pending (`waiting`) or too many reply bytes are unsent, the loop
 * stops reading from the socket (its epoll interest drops EPOLLIN and keeps
 * EPOLLRDHUP, so a hang-up is still seen), which bounds what a client can make
 * the server buffer to one frame in and a few MiB out. Before its AUTH frame
 * is accepted a connection is read only up to the unauthenticated allowance,
 * so a client without the token holds a few KiB, not a frame.
 */
struct Conn {
  Conn(int fd, Peer peer, uint32_t max_body)
      : fd(fd), address(std::move(peer.address)), peer(std::move(peer.name)), parser(max_body) {}

  int fd;
  std::string address;
  std::string peer;
  proto::FrameParser parser;
  std::deque<OutPiece> out;  // in the order it goes out
  size_t out_bytes = 0;      // not yet sent, of all of `out`
  size_t read_before_auth = 0;  // bytes taken from the socket before AUTH was accepted
  size_t counted_bytes = 0;     // this connection's share of Stats::buffered_bytes
  bool authed = false;
  bool closing = false;  // close once `out` is flushed (a refused token)
  bool dead = false;     // dropped; closed at the end of the current batch
  uint32_t interest = 0;

  bool waiting = false;  // a GET or WAIT is pending
  proto::MessageType wait_type = proto::MessageType::Wait;
  std::vector<std::string> wait_keys;
  size_t missing = 0;  // keys of the wait registered in `watchers`, not yet written
  std::optional<Clock::time_point> deadline;  // of the wait, or of AUTH

  size_t unsent() const { return out_bytes; }
  // Where the next reply's own bytes go: not into a piece being sent, which
  // then is let go as soon as it is sent.
  std::vector<uint8_t>& own_tail() {
    if (out.empty() || out.back().shared || out.back().sent > 0) out.emplace_back();
    return out.back().own;
  }
};

// How a connection ends: normally (quiet), or for bad input (logged, and
// counted by rejected_clients()), or for our own failure (logged).
enum class Drop { Quiet, Reject, Internal };

// The counters behind TcpStoreServer::stats(): written by the loop thread,
// read by any.
struct Stats {
  std::atomic<int64_t> connections{0};
  std::atomic<int64_t> unauthenticated{0};
  std::atomic<int64_t> buffered_bytes{0};
  std::atomic<int64_t> refused_connections{0};
  std::atomic<int64_t> failed_accepts{0};
  std::atomic<int64_t> wait_key_checks{0};
};

}  // namespace

struct TcpStoreServer::Impl {
  TcpStoreServerOptions options;
  // What a connection may send before its AUTH is accepted: the option, but
  // never less than a frame carrying our own token.
  size_t unauthenticated_allowance;
  // The AUTH reply's field: the largest request body served (protocol.h).
  std::string max_body_field;
  int listen_fd = -1, epoll_fd = -1, wake_fd = -1;
  uint16_t port = 0;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> rejected{0};
  Stats stats;
  std::thread thread;

  // Touched only by the loop thread.
  std::unordered_map<std::string, Value> data;
  std::unordered_map<int, std::unique_ptr<Conn>> conns;
  // A missing key -> the fds of the waits that counted it missing.
  std::unordered_map<std::string, std::unordered_set<int>> watchers;
  std::set<std::pair<Clock::time_point, int>> deadlines;
  std::vector<int> resume;    // fds whose buffered requests may go on
  std::vector<int> to_close;  // fds dropped during this batch
  std::optional<Clock::time_point> accept_paused_until;
  // Work handed to the loop thread by others (delete_keys_if), which write
  // wake_fd after adding some; once the loop has ended, callers run it
  // themselves (nothing else touches the loop's state then).
  std::mutex tasks_mutex;
  std::vector<std::function<void()>> tasks;
  bool loop_ended = false;
  store_limits::ConnectionCounter counter;
  store_limits::RateLimitedLog accept_failures{kWarningInterval};
  store_limits::RateLimitedLog refusals{kWarningInterval};

  explicit Impl(TcpStoreServerOptions opts)
      : options(std::move(opts)),
        unauthenticated_allowance(std::max<size_t>(
            options.max_unauthenticated_bytes, proto::kHeaderBytes + 4 + options.token.size())),
        max_body_field(proto::encode_i64(options.max_frame_bytes)),
        counter(options.max_connections, options.max_connections_per_address) {
    LOCKSTEP_CHECK(options.max_frame_bytes >= unauthenticated_allowance - proto::kHeaderBytes,
                   "TcpStoreServer: max_frame_bytes {} is too small for an AUTH frame of {} "
                   "bytes; raise it",
                   options.max_frame_bytes, unauthenticated_allowance);
    store_setup::make_room_for_clients(options.expected_clients);
    const store_setup::ListeningSocket listening =
        store_setup::listen_on(options.host, options.port);
    listen_fd = listening.fd;
    port = listening.port;
    epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epoll_fd < 0 || wake_fd < 0) {
      const int err = errno;
      if (epoll_fd >= 0) close(epoll_fd);
      if (wake_fd >= 0) close(wake_fd);
      close(listen_fd);
      throw Error(
          fmt::format("TcpStoreServer: cannot create its epoll/eventfd: {}", strerror(err)));
    }
    watch(listen_fd, EPOLLIN, EPOLL_CTL_ADD);
    watch(wake_fd, EPOLLIN, EPOLL_CTL_ADD);
    thread = std::thread([this] { loop(); });
  }

  ~Impl() {
    stop = true;
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd, &one, sizeof one);
    if (thread.joinable()) thread.join();
    for (auto& [fd, conn] : conns) close(fd);
    close(listen_fd);
    close(wake_fd);
    close(epoll_fd);
  }

  // Runs fn on the loop thread and returns when it has run.
  void run_on_loop(std::function<void()> fn) {
    std::packaged_task<void()> task(std::move(fn));
    std::future<void> done = task.get_future();
    {
      std::lock_guard lock(tasks_mutex);
      if (loop_ended) {
        task();
        return done.get();
      }
      tasks.emplace_back([&task] { task(); });
    }
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd, &one, sizeof one);
    done.get();
  }

  void run_tasks() {
    uint64_t count = 0;
    [[maybe_unused]] ssize_t n = read(wake_fd, &count, sizeof count);
    std::vector<std::function<void()>> now;
    {
      std::lock_guard lock(tasks_mutex);
      now.swap(tasks);
    }
    for (auto& task : now) task();
  }

  void loop() {
    loop_events();
    std::lock_guard lock(tasks_mutex);
    loop_ended = true;
    for (auto& task : tasks) task();  // handed over before the loop saw them
    tasks.clear();
  }

  void loop_events() {
    std::vector<epoll_event> events(256);
    while (!stop) {
      int timeout_ms = -1;
      auto next = deadlines.empty() ? std::optional<Clock::time_point>()
                                    : std::optional(deadlines.begin()->first);
      if (accept_paused_until && (!next || *accept_paused_until < *next))
        next = accept_paused_until;
      if (next) {
        auto ms = std::chrono::ceil<std::chrono::milliseconds>(*next - Clock::now()).count();
        timeout_ms = static_cast<int>(std::clamp<int64_t>(ms, 0, 60'000));
      }
      const int n =
          epoll_wait(epoll_fd, events.data(), static_cast<int>(events.size()), timeout_ms);
      if (n < 0 && errno != EINTR) {
        fmt::print(stderr, "lockstep store server: epoll_wait failed: {}; the server stops\n",
                   strerror(errno));
        return;
      }
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        if (fd == wake_fd) {  // `stop` is checked by the while
          run_tasks();
          continue;
        }
        if (fd == listen_fd) {
          accept_all();
          continue;
        }
        guarded(fd, [&](Conn& c) { on_event(c, events[i].events); });
      }
      expire(Clock::now());
      // Connections whose wait ended may have more requests buffered.
      while (!resume.empty()) {
        const int fd = resume.back();
        resume.pop_back();
        guarded(fd, [&](Conn& c) { process(c); });
      }
      close_dropped();
    }
  }

  // Runs fn on the live connection `fd`; a failure of ours (e.g. bad_alloc on
  // a huge value) drops that client only.
  template <typename Fn>
  void guarded(int fd, Fn&& fn) {
    auto it = conns.find(fd);
    if (it == conns.end() || it->second->dead) return;
    try {
      fn(*it->second);
    } catch (const std::exception& e) {
      drop(*it->second, fmt::format("internal error: {}", e.what()), Drop::Internal);
    }
  }

  void accept_all() {
    if (accept_paused_until) return;
    while (true) {
      sockaddr_storage addr{};
      socklen_t len = sizeof addr;
      const int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          out_of_descriptors(errno);
        }
        return;
      }
      Peer peer = peer_of(addr, len);
      if (auto why = counter.admit(peer.address)) {
        turn_away(fd, peer, *why);
        continue;
      }
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto conn = std::make_unique<Conn>(
          fd, std::move(peer),
          static_cast<uint32_t>(unauthenticated_allowance - proto::kHeaderBytes));
      Conn& c = *conn;
      conns.emplace(fd, std::move(conn));
      ++stats.connections;
      ++stats.unauthenticated;
      c.interest = EPOLLIN | EPOLLRDHUP;
      watch(fd, c.interest, EPOLL_CTL_ADD);
      set_deadline(c, Clock::now() + kAuthTimeout);
    }
  }

  // Out of descriptors: stop polling the listener for a moment rather than
  // spin on it; pending clients wait in the backlog (or retry). One line per
  // kWarningInterval, however often it recurs.
  void out_of_descriptors(int error) {
    ++stats.failed_accepts;
    accept_paused_until = Clock::now() + kAcceptRetry;
    watch(listen_fd, 0);
    const auto held = accept_failures.note(Clock::now());
    if (!held) return;
    log_line(fmt::format(
        "cannot accept a client: {} ({} clients connected{}); raise the open-files limit "
        "(ulimit -n). Retrying every {} ms; reported at most every {} s",
        strerror(error), conns.size(), held_back(*held, "failed accepts"), kAcceptRetry.count(),
        std::chrono::duration_cast<std::chrono::seconds>(kWarningInterval).count()));
  }

  // A connection over the caps: says why (in place of the AUTH reply the
  // client waits for) and closes. What the client sent already is read
  // first, so that the close is a plain FIN rather than a reset.
  void turn_away(int fd, const Peer& peer, const std::string& why) {
    ++stats.refused_connections;
    const std::string text = fmt::format("{}{}", proto::kBusyPrefix, why);
    const auto frame = proto::encode_frame(proto::MessageType::Error, {text});
    [[maybe_unused]] ssize_t n = send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    shutdown(fd, SHUT_WR);
    char sink[4096];
    for (int i = 0; i < 4 && recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
    }
    close(fd);
    const auto held = refusals.note(Clock::now());
    if (!held) return;
    log_line(fmt::format("turned away client {}: {}{}", peer.name, why,
                         held_back(*held, "connections turned away")));
  }

  void on_event(Conn& c, uint32_t events) {
    if (events & EPOLLOUT) flush(c);
    if (c.dead) return;
    if (c.interest & EPOLLIN) {
      if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) read_some(c);
    } else if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
      // Not reading (a wait is pending): the client gave up or died.
      drop(c, c.waiting ? "hung up during a pending get/wait" : "hung up", Drop::Quiet);
      return;
    }
    if (!c.dead) refresh(c);
  }

  void read_some(Conn& c) {
    char buffer[kReadChunk];
    size_t want = sizeof buffer;
    if (!c.authed) {
      // (The parser's pre-AUTH frame limit ends the connection before this
      // runs out; this bounds what it buffers whatever the parser does.)
      if (c.read_before_auth >= unauthenticated_allowance) {
        drop(c,
             fmt::format("sent {} bytes without a complete AUTH frame",
                         c.read_before_auth),
             Drop::Reject);
        return;
      }
      want = std::min(want, unauthenticated_allowance - c.read_before_auth);
    }
    ssize_t n;
    do {
      n = recv(c.fd, buffer, want, 0);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      const std::string cause = n == 0 ? "closed the connection" : strerror(errno);
      if (c.parser.mid_frame()) {
        drop(c, fmt::format("{} in the middle of a frame", cause), Drop::Reject);
      } else {
        drop(c, cause, Drop::Quiet);
      }
      return;
    }
    if (!c.authed) c.read_before_auth += static_cast<size_t>(n);
    c.parser.feed(buffer, static_cast<size_t>(n));
    process(c);
  }

  // Keeps stats.buffered_bytes equal to what the live connections hold.
  void count_buffers(Conn& c) {
    size_t now = c.dead ? 0 : c.parser.buffered_bytes();
    for (const OutPiece& piece : c.out) now += c.dead ? 0 : piece.own.capacity();
    stats.buffered_bytes += static_cast<int64_t>(now) - static_cast<int64_t>(c.counted_bytes);
    c.counted_bytes = now;
  }

  // Handles the complete requests buffered for `c`, in order, until one has to
  // wait or the output backs up.
  void process(Conn& c) {
    proto::Frame frame;
    while (!c.dead && !c.closing && !c.waiting && c.unsent() < kOutputHighWater) {
      const auto status = c.parser.next(frame);
      if (status == proto::FrameParser::Status::NeedMore) break;
      if (status == proto::FrameParser::Status::Error) {
        drop(c,
             fmt::format("malformed input{} ({}): {}", c.authed ? "" : " before AUTH",
                         proto::parse_error_name(c.parser.error()), c.parser.message()),
             Drop::Reject);
        return;
      }
      handle(c, frame);
    }
    if (!c.dead) refresh(c);
  }

  void handle(Conn& c, proto::Frame& frame) {
    using T = proto::MessageType;
    auto& f = frame.fields;
    if (!c.authed) {
      if (frame.type != T::Auth) {
        drop(c,
             fmt::format("sent {} before authenticating (the first frame must be AUTH)",
                         proto::type_name(frame.type)),
             Drop::Reject);
        return;
      }
      const std::string& token = options.token;
      // Compares every byte whatever the mismatch, so timing does not leak the token.
      unsigned diff = f[0].size() != token.size();
      for (size_t i = 0; i < f[0].size(); ++i)
        diff |= f[0][i] ^ token[i % std::max<size_t>(1, token.size())];
      if (diff != 0) {
        fmt::print(stderr, "lockstep store server: refused client {}: wrong token\n", c.peer);
        ++rejected;
        reply(c, T::Error, {"wrong token"});
        c.closing = true;
        return;
      }
      c.authed = true;
      --stats.unauthenticated;
      c.parser.set_max_body_bytes(options.max_frame_bytes);
      set_deadline(c, std::nullopt);
      reply(c, T::Ok, {max_body_field});
      return;
    }
    switch (frame.type) {
      case T::Auth: reply(c, T::Ok, {max_body_field}); return;
      case T::Set:
        data[f[0]] = make_value(std::move(f[1]));
        reply(c, T::Ok, {});
        notify(f[0]);
        return;
      case T::Get: start_wait(c, T::Get, {std::move(f[0])}, proto::decode_i64(f[1])); return;
      case T::Wait:
        start_wait(c, T::Wait, std::vector<std::string>(f.begin() + 1, f.end()),
                   proto::decode_i64(f[0]));
        return;
      case T::Add: {
        auto it = data.find(f[0]);
        int64_t result = 0;
        std::string error;
        auto text = proto::add_to_counter(it == data.end() ? nullptr : it->second.get(),
                                          proto::decode_i64(f[1]), &result, &error);
        if (!text) {
          reply(c, T::Error, {fmt::format("add on key '{}': {}", f[0], error)});
          return;
        }
        data[f[0]] = make_value(std::move(*text));
        reply(c, T::Ok, {proto::encode_i64(result)});
        notify(f[0]);
        return;
      }
      case T::CompareSet: {
        auto it = data.find(f[0]);
        const bool matches = it == data.end() ? f[1].empty() : *it->second == f[1];
        if (!matches) {
          reply(c, T::Ok, {it == data.end() ? std::string_view() : std::string_view(*it->second)});
          return;
        }
        data[f[0]] = make_value(f[2]);
        reply(c, T::Ok, {f[2]});
        notify(f[0]);
        return;
      }
      case T::Delete: reply(c, T::Ok, {proto::encode_i64(data.erase(f[0]) ? 1 : 0)}); return;
      case T::NumKeys:
        reply(c, T::Ok, {proto::encode_i64(static_cast<int64_t>(data.size()))});
        return;
      case T::Ok:
      case T::Error:
      case T::Timeout:
        drop(c, fmt::format("sent a {} reply frame as a request", proto::type_name(frame.type)),
             Drop::Reject);
        return;
    }
  }

  void reply(Conn& c, proto::MessageType type, const std::vector<std::string_view>& fields) {
    std::vector<uint8_t>& own = c.own_tail();
    const size_t before = own.size();
    proto::append_frame(own, type, fields);
    c.out_bytes += own.size() - before;
  }

  // An OK reply carrying a stored value; a big one is sent from the store's copy.
  void reply_value(Conn& c, const Value& value) {
    if (value->size() < kShareValueBytes) {
      reply(c, proto::MessageType::Ok, {*value});
      return;
    }
    std::vector<uint8_t>& own = c.own_tail();
    const size_t before = own.size();
    proto::append_frame_head(own, proto::MessageType::Ok, value->size());
    c.out_bytes += own.size() - before + value->size();
    c.out.push_back(OutPiece{.shared = value});
  }

  // Sends what the socket takes; a piece sent in full is let go at once.
  void flush(Conn& c) {
    while (!c.out.empty()) {
      OutPiece& piece = c.out.front();
      const ssize_t n =
          send(c.fd, piece.at_sent(), piece.size() - piece.sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0) {
        drop(c, fmt::format("could not be written to: {}", strerror(errno)), Drop::Quiet);
        return;
      }
      piece.sent += static_cast<size_t>(n);
      c.out_bytes -= static_cast<size_t>(n);
      if (piece.sent == piece.size()) c.out.pop_front();
    }
  }

  // Sends what it can, then sets the epoll interest to what `c` needs now.
  void refresh(Conn& c) {
    flush(c);
    if (c.dead) return;
    if (c.closing && c.unsent() == 0) {
      drop(c, "refused", Drop::Quiet);
      return;
    }
    uint32_t want = EPOLLRDHUP;
    if (!c.waiting && !c.closing && c.unsent() < kOutputHighWater) want |= EPOLLIN;
    if (c.unsent() > 0) want |= EPOLLOUT;
    if (want != c.interest) {
      // Output drained below the mark with requests still buffered: go on.
      if ((want & EPOLLIN) && !(c.interest & EPOLLIN)) resume.push_back(c.fd);
      c.interest = want;
      watch(c.fd, want);
    }
    count_buffers(c);
  }

  void watch(int fd, uint32_t events, int op = EPOLL_CTL_MOD) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd, op, fd, &ev);
  }

  void drop(Conn& c, const std::string& why, Drop kind) {
    if (c.dead) return;
    if (kind == Drop::Reject) ++rejected;
    if (kind != Drop::Quiet) {
      fmt::print(stderr, "lockstep store server: dropped client {}: {}\n", c.peer, why);
    }
    if (c.waiting) end_wait(c);
    set_deadline(c, std::nullopt);
    c.dead = true;
    to_close.push_back(c.fd);
  }

  void close_dropped() {
    for (int fd : to_close) {
      epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
      close(fd);
      auto it = conns.find(fd);
      if (it != conns.end()) {
        Conn& c = *it->second;
        count_buffers(c);  // dead: its share goes back to 0
        counter.release(c.address);
        --stats.connections;
        if (!c.authed) --stats.unauthenticated;
        conns.erase(it);
      }
    }
    to_close.clear();
  }

  /*
   * Pending GET and WAIT. A request whose keys all exist is answered at once.
   * Otherwise the connection is registered in `watchers` under each missing key,
   * counts them, and gets a deadline, which answers TIMEOUT. The write that
   * makes a key exist takes one off the count of each of its watchers, and a
   * count at 0 rescans the keys (one may have been deleted since): a write
   * costs its watchers, not their keys (every rank waits on every rank's key
   * of a large job). Either way the reply goes out on the connection, so the
   * next request finds the stream in step.
   */
  void start_wait(Conn& c, proto::MessageType type, std::vector<std::string> keys, int64_t ms) {
    c.waiting = true;
    c.wait_type = type;
    c.wait_keys = std::move(keys);
    if (try_finish_wait(c)) return;
    set_deadline(
        c, Clock::now() + std::chrono::milliseconds(std::clamp<int64_t>(ms, 0, kMaxTimeoutMs)));
  }

  // Replies and ends the wait when every key exists; otherwise registers
  // under the missing ones and counts them (once each, whatever repeats).
  bool try_finish_wait(Conn& c) {
    c.missing = 0;
    for (const auto& key : c.wait_keys) {
      if (!data.contains(key) && watchers[key].insert(c.fd).second) ++c.missing;
    }
    stats.wait_key_checks += static_cast<int64_t>(c.wait_keys.size());
    if (c.missing > 0) return false;
    if (c.wait_type == proto::MessageType::Get) {
      reply_value(c, data.at(c.wait_keys[0]));
    } else {
      reply(c, proto::MessageType::Ok, {});
    }
    end_wait(c);
    resume.push_back(c.fd);
    return true;
  }

  void end_wait(Conn& c) {
    for (const auto& key : c.wait_keys) {
      auto it = watchers.find(key);
      if (it == watchers.end()) continue;
      it->second.erase(c.fd);
      if (it->second.empty()) watchers.erase(it);
    }
    c.waiting = false;
    c.wait_keys.clear();
    set_deadline(c, std::nullopt);
  }

  void set_deadline(Conn& c, std::optional<Clock::time_point> when) {
    if (c.deadline) deadlines.erase({*c.deadline, c.fd});
    c.deadline = when;
    if (when) deadlines.insert({*when, c.fd});
  }

  // After a write to `key`: its watchers (there are some only when the key
  // was missing until now) have one key fewer to wait for.
  void notify(const std::string& key) {
    auto it = watchers.find(key);
    if (it == watchers.end()) return;
    const std::vector<int> fds(it->second.begin(), it->second.end());
    watchers.erase(it);
    for (int fd : fds) {
      auto conn = conns.find(fd);
      if (conn == conns.end() || conn->second->dead || !conn->second->waiting) continue;
      Conn& c = *conn->second;
      if (--c.missing == 0 && try_finish_wait(c)) refresh(c);
    }
  }

  void expire(Clock::time_point now) {
    if (accept_paused_until && *accept_paused_until <= now) {
      accept_paused_until.reset();
      watch(listen_fd, EPOLLIN);
    }
    while (!deadlines.empty() && deadlines.begin()->first <= now) {
      Conn& c = *conns.at(deadlines.begin()->second);
      if (!c.authed) {  // (or refused, and not reading our reply)
        drop(c, fmt::format("sent no AUTH frame within {} s of connecting", kAuthTimeout.count()),
             c.closing ? Drop::Quiet : Drop::Reject);
        continue;
      }
      std::vector<std::string_view> missing;
      for (const auto& key : c.wait_keys) {
        if (!data.contains(key)) missing.push_back(key);
      }
      reply(c, proto::MessageType::Timeout, missing);
      end_wait(c);
      resume.push_back(c.fd);
      refresh(c);
    }
  }
};

TcpStoreServer::TcpStoreServer(TcpStoreServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

TcpStoreServer::~TcpStoreServer() = default;

uint16_t TcpStoreServer::port() const { return impl_->port; }

int64_t TcpStoreServer::rejected_clients() const { return impl_->rejected.load(); }

size_t TcpStoreServer::delete_keys_if(const std::function<bool(const std::string&)>& doomed) {
  size_t deleted = 0;
  // A key that exists has no watchers (they wait for missing keys): nothing
  // else needs telling.
  impl_->run_on_loop([&] { deleted = std::erase_if(impl_->data, [&](const auto& entry) {
                             return doomed(entry.first);
                           }); });
  return deleted;
}

TcpStoreServerStats TcpStoreServer::stats() const {
  const Stats& s = impl_->stats;
  return {.connections = s.connections.load(),
          .unauthenticated = s.unauthenticated.load(),
          .buffered_bytes = s.buffered_bytes.load(),
          .refused_connections = s.refused_connections.load(),
          .failed_accepts = s.failed_accepts.load(),
          .wait_key_checks = s.wait_key_checks.load()};
}

}  // namespace lockstep::distributed
