#include "lockstep/collectives/spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "lockstep/distributed/launch_env.h"
#include "lockstep/distributed/exit_status.h"
#include "lockstep/distributed/exited_ranks.h"
#include "lockstep/distributed/store/tcp_store.h"
#include "lockstep/runtime/env.h"
#include "lockstep/runtime/open_files.h"
#include "lockstep/runtime/threads.h"

namespace lockstep::collectives {
namespace {

using Clock = std::chrono::steady_clock;

// What the parent holds of one child.
struct Child {
  int rank = 0;
  pid_t pid = -1;      // also its process group id
  int go_fd = -1;      // our end of a socket pair: the store's port, then closed
  int error_fd = -1;   // read end: the child's exception message
  int pid_fd = -1;     // readable once the child has exited (-1: kernel without pidfd)
  std::string error;   // what has come through error_fd
  bool alive = true;
  int status = 0;
  bool status_lost = false;  // reaped by another waitpid in this process
};

// With SIGCHLD ignored (or SA_NOCLDWAIT) the kernel reaps the children itself
// and waitpid cannot say how they ended, so a failed rank would pass for a
// finished one. spawn restores the default for its duration.
class ChildStatusKept {
 public:
  ChildStatusKept() {
    ::sigaction(SIGCHLD, nullptr, &previous_);
    changed_ = previous_.sa_handler == SIG_IGN || (previous_.sa_flags & SA_NOCLDWAIT) != 0;
    if (!changed_) return;
    struct sigaction keep = previous_;
    if (keep.sa_handler == SIG_IGN) keep.sa_handler = SIG_DFL;
    keep.sa_flags &= ~SA_NOCLDWAIT;
    ::sigaction(SIGCHLD, &keep, nullptr);
  }
  ~ChildStatusKept() {
    if (changed_) ::sigaction(SIGCHLD, &previous_, nullptr);
  }
  ChildStatusKept(const ChildStatusKept&) = delete;
  ChildStatusKept& operator=(const ChildStatusKept&) = delete;

 private:
  struct sigaction previous_ {};
  bool changed_ = false;
};

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// The write end of the pipe that SIGINT, SIGTERM and SIGHUP are noted in
// while spawn waits; -1 outside it.
std::atomic<int> g_signal_pipe{-1};

extern "C" void note_stop_signal(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  (void)!::write(g_signal_pipe.load(), &byte, 1);
  errno = saved;
}

// While spawn waits, SIGINT, SIGTERM and SIGHUP (a terminal's Ctrl-C, a
// scheduler's preemption) and SIGTSTP and SIGCONT (Ctrl-Z, fg) are noted
// instead of acted on, so that spawn can pass them on to the children, which
// lead process groups of their own and so get none of them from the terminal.
// A signal the caller ignores stays ignored. Once the children have ended, the
// caller's handlers come back and the first stop signal is raised again, so
// the program ends (or handles it) as it would have, after its ranks have had
// their chance to.
class StopSignalsCaught {
 public:
  StopSignalsCaught() {
    if (::pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0) return;  // signals then act as before
    g_signal_pipe.store(fds_[1]);
    for (size_t k = 0; k < kSignals.size(); ++k) {
      ::sigaction(kSignals[k], nullptr, &previous_[k]);
      if (previous_[k].sa_handler == SIG_IGN) continue;
      struct sigaction note {};
      note.sa_handler = note_stop_signal;
      note.sa_flags = SA_RESTART;
      sigemptyset(&note.sa_mask);
      caught_[k] = ::sigaction(kSignals[k], &note, nullptr) == 0;
    }
  }
  ~StopSignalsCaught() {
    for (size_t k = 0; k < kSignals.size(); ++k)
      if (caught_[k]) ::sigaction(kSignals[k], &previous_[k], nullptr);
    g_signal_pipe.store(-1);
    close_fd(fds_[0]);
    close_fd(fds_[1]);
  }
  StopSignalsCaught(const StopSignalsCaught&) = delete;
  StopSignalsCaught& operator=(const StopSignalsCaught&) = delete;

  int fd() const { return fds_[0]; }
  // The signals noted since the last call, oldest first.
  std::vector<int> take() const {
    std::vector<int> signals;
    unsigned char bytes[16];
    while (fds_[0] >= 0) {
      const ssize_t n = ::read(fds_[0], bytes, sizeof bytes);
      if (n > 0) {
        signals.insert(signals.end(), bytes, bytes + n);
      } else if (!(n < 0 && errno == EINTR)) {
        break;
      }
    }
    return signals;
  }
  // The caller's handlers back, then `sig` raised under them.
  void raise_again(int sig) {
    for (size_t k = 0; k < kSignals.size(); ++k) {
      if (caught_[k]) ::sigaction(kSignals[k], &previous_[k], nullptr);
      caught_[k] = false;
    }
    ::raise(sig);
  }

 private:
  static constexpr std::array<int, 5> kSignals{SIGINT, SIGTERM, SIGHUP, SIGTSTP, SIGCONT};
  int fds_[2] = {-1, -1};
  std::array<struct sigaction, kSignals.size()> previous_{};
  std::array<bool, kSignals.size()> caught_{};
};

// A descriptor that polls readable once `pid` has exited; -1 where the kernel
// has no pidfd_open (before 5.3).
int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
    } else if (!(n < 0 && errno == EINTR)) {
      return;
    }
  }
}

// The store's port, sent by the parent once it serves; empty when the parent
// gave up before (the pipe closed without it).
std::string read_port(int fd) {
  std::string text;
  char c = 0;
  for (;;) {
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || c == '\n') return n <= 0 ? std::string() : text;
    text += c;
  }
}

[[noreturn]] void run_child(int rank, int nprocs, pid_t parent, int go_fd, int error_fd,
                            const std::string& token, bool one_thread,
                            const std::function<void(int)>& fn, const SpawnOptions& options) {
  // Dies with the parent, even if the parent died between fork and prctl.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);
  ::setpgid(0, 0);
  // stdin from /dev/null, as lockstep-run's ranks and Python's forked
  // children read it: leading a process group of its own, never a terminal's
  // foreground one, a child that read the caller's terminal would be stopped
  // for good (SIGTTIN).
  if (const int null_fd = ::open("/dev/null", O_RDONLY); null_fd > 0) {
    ::dup2(null_fd, STDIN_FILENO);
    ::close(null_fd);
  }
  // Stopping works whatever handlers the caller installed (a test framework's,
  // a training loop's checkpoint-on-SIGTERM); fn may install its own.
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGPIPE, SIGCHLD}) ::signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  const std::string port = read_port(go_fd);
  ::close(go_fd);
  if (port.empty()) ::_exit(1);  // the parent could not start the store

  distributed::RankInfo info;
  info.rank = rank;
  info.world_size = nprocs;
  info.local_rank = rank;
  info.local_world_size = nprocs;
  info.store_host = "127.0.0.1";
  info.store_port = std::atoi(port.c_str());
  info.token = token;
  for (const auto& [name, value] : distributed::rank_variables(info, 1))
    ::setenv(name.c_str(), value.c_str(), 1);
  // A job of its own, not a launcher's attempt: an inherited restart count
  // would put its ranks' keys under another attempt's prefix than spawn's
  // (distributed/exited_ranks.h), and an inherited job id would let its
  // training run continue the outer job's checkpoints (train/training_run.h).
  ::unsetenv("LOCKSTEP_RESTART_COUNT");
  ::unsetenv("LOCKSTEP_JOB_ID");
  // The launcher watches the rank that called spawn, not its children: beats
  // of theirs would have it watch the rank from their first beat on, and call
  // it hung once they end while it goes on without beating (runtime/liveness.h).
  ::unsetenv("LOCKSTEP_HEARTBEAT_FD");
  ::unsetenv("LOCKSTEP_HEARTBEAT_MS");
  for (const auto& [name, value] : options.env) ::setenv(name.c_str(), value.c_str(), 1);
  // The parent's launcher's file for its post-mortem, not this child's.
  ::unsetenv("LOCKSTEP_FLIGHT_RECORDER");

  int code = 0;
  try {
    // The CPU kernels' thread count was read from OMP_NUM_THREADS when this
    // process started, so one given in options.env is applied here; with
    // none anywhere, a child runs on one thread.
    const bool env_threads =
        std::any_of(options.env.begin(), options.env.end(),
                    [](const auto& v) { return v.first == "OMP_NUM_THREADS"; });
    if (one_thread && !env_threads) ::setenv("OMP_NUM_THREADS", "1", 1);
    if (one_thread || env_threads) {
      runtime::set_num_threads(
          *runtime::read_whole_number(runtime::process_env(), "OMP_NUM_THREADS", 1));
    }
    fn(rank);
  } catch (const std::exception& e) {
    write_all(error_fd, e.what());
    code = 1;
  } catch (...) {
    write_all(error_fd, "an exception that is not a std::exception");
    code = 1;
  }
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  ::_exit(code);
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) text += i + 1 == ranks.size() ? " and " : ", ";
    text += std::to_string(ranks[i]);
  }
  return text;
}

class Supervisor {
 public:
  // `on_exited`: told of a rank that exits 0 while others run, which they
  // may be waiting for to join their group.
  Supervisor(std::vector<Child>& children, const SpawnOptions& options,
             const StopSignalsCaught& signals,
             std::function<void(int rank, const std::string& how)> on_exited)
      : children_(children), options_(options), signals_(signals),
        on_exited_(std::move(on_exited)) {}

  // The first SIGINT, SIGTERM or SIGHUP that came while waiting; 0: none.
  int signalled() const { return signalled_; }

  // Waits for every child; the first failure, if any.
  std::optional<SpawnError> run() {
    start_ = Clock::now();
    for (;;) {
      reap();
      if (alive() == 0) break;
      const auto now = Clock::now();
      if (kill_at_ && now >= *kill_at_) kill_all();
      const bool timing = !failure_ && signalled_ == 0 && options_.timeout.has_value();
      if (timing && now - start_ >= *options_.timeout) {
        on_timeout();
        continue;
      }

      std::vector<pollfd> fds;
      if (signals_.fd() >= 0) fds.push_back({signals_.fd(), POLLIN, 0});
      bool all_pidfds = true;
      for (auto& c : children_) {
        if (c.error_fd >= 0) fds.push_back({c.error_fd, POLLIN, 0});
        if (c.alive && c.pid_fd >= 0) fds.push_back({c.pid_fd, POLLIN, 0});
        if (c.alive && c.pid_fd < 0) all_pidfds = false;
      }
      // Without pidfds (kernels before 5.3), look for exits every 20 ms.
      int timeout_ms = all_pidfds ? -1 : 20;
      const auto until = [&](Clock::time_point at) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(at - now).count();
        const int ms = static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
        timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
      };
      if (kill_at_) until(*kill_at_);
      if (timing) until(start_ + *options_.timeout);
      if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR)
        throw Error(fmt::format("spawn: poll failed: {}", std::strerror(errno)));
      for (auto& c : children_) read_error(c, /*to_the_end=*/false);
      for (int sig : signals_.take()) {
        if (sig == SIGTSTP || sig == SIGCONT) {
          job_control(sig);
        } else {
          on_signal(sig);
        }
      }
    }
    // What the children wrote before they exited (a grandchild that still
    // holds a pipe open does not keep us here).
    for (auto& c : children_) read_error(c, /*to_the_end=*/true);
    if (failed_rank_ >= 0) {
      failure_ = child_failure();
    } else if (failure_ && killed_on_signal_) {  // the timeout
      failure_ = SpawnError(failure_->what() + killed_on_signal_text(stopped_), failure_->rank(),
                            failure_->exit_code());
    }
    return failure_;
  }

 private:
  int alive() const {
    return static_cast<int>(std::count_if(children_.begin(), children_.end(),
                                          [](const Child& c) { return c.alive; }));
  }

  void reap() {
    for (auto& c : children_) {
      if (!c.alive) continue;
      int status = 0;
      const pid_t r = ::waitpid(c.pid, &status, WNOHANG);
      if (r == 0 || (r < 0 && errno == EINTR)) continue;
      c.alive = false;
      c.status = r < 0 ? 0 : status;
      c.status_lost = r < 0;  // ECHILD: reaped elsewhere; success cannot be told
      close_fd(c.pid_fd);
      if (!failure_ && failed_rank_ < 0 &&
          (c.status_lost || distributed::ended_in_failure(c.status))) {
        failed_rank_ = c.rank;
        if (signalled_ == 0) stop(SIGTERM);  // after a signal, each rank has had it
      } else if (!failure_ && failed_rank_ < 0 && signalled_ == 0 && alive() > 0) {
        on_exited_(c.rank, distributed::describe_wait_status(c.status));
      }
    }
  }

  // Appends what the child's error pipe holds now (or, with to_the_end, all
  // it holds), closing it at end of file.
  static void read_error(Child& c, bool to_the_end) {
    char buffer[4096];
    while (c.error_fd >= 0) {
      const ssize_t n = ::read(c.error_fd, buffer, sizeof buffer);
      if (n > 0) {
        c.error.append(buffer, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 || errno != EAGAIN || to_the_end) close_fd(c.error_fd);
      return;
    }
  }

  SpawnError child_failure() const {
    const Child& c = children_[static_cast<size_t>(failed_rank_)];
    const std::string how =
        !c.error.empty() ? fmt::format("threw: {}", c.error)
        : c.status_lost  ? "ended, but another waitpid in this process (a SIGCHLD handler?) "
                           "took its exit status, so spawn cannot tell whether it succeeded"
                         : distributed::describe_wait_status(c.status);
    const std::string stopped =
        stopped_ == 0 ? ""
                      : fmt::format("; stopped the other {}",
                                    stopped_ == 1 ? "rank" : fmt::format("{} ranks", stopped_));
    const std::string passed_on =
        signalled_ == 0 || killed_on_signal_
            ? ""
            : fmt::format(" after spawn passed on the {} it was sent",
                          distributed::signal_name(signalled_));
    return SpawnError(fmt::format("spawn: rank {} of {} (pid {}) {}{}{}{}", c.rank,
                                  children_.size(), c.pid, how, passed_on, stopped,
                                  killed_on_signal_text(stopped_)),
                      c.rank, c.status_lost ? -1 : distributed::exit_code_of(c.status));
  }

  void on_timeout() {
    std::vector<int> running;
    for (const auto& c : children_)
      if (c.alive) running.push_back(c.rank);
    const double seconds = std::chrono::duration<double>(*options_.timeout).count();
    failure_.emplace(fmt::format("spawn: {} of {} still running after the timeout of {:g} s (a "
                                 "hang? a collective waiting for a rank that never calls it?); "
                                 "stopped {}",
                                 ranks_text(running), children_.size(), seconds,
                                 running.size() == 1 ? "it" : "them"),
                     running.front(), -1);
    stop(SIGTERM);
  }

  // A signal to stop, passed on to every child as lockstep-run does: the
  // first is forwarded (a rank may save its work on it); a second, or a first
  // that comes while the children already stop after a failure or the timeout
  // (they have had their SIGTERM), kills them at once.
  void on_signal(int sig) {
    const bool first = signalled_ == 0;
    const bool stopping = stopping_after_failure();
    if (first) signalled_ = sig;
    if (first && !stopping) {
      stop(sig);
      return;
    }
    if (first) killed_on_signal_ = alive() > 0;
    kill_all();
  }

  // Ctrl-Z (SIGTSTP) stops every child, then this process, as lockstep-run
  // does; the SIGCONT that continues it (fg, bg, kill -CONT) continues them,
  // and the time stopped does not count toward the timeout. Not while the
  // children stop after a failure, a timeout or a signal.
  void job_control(int sig) {
    if (signalled_ != 0 || stopping_after_failure()) return;
    if (sig == SIGTSTP) {
      signal_all(SIGSTOP);
      const auto stopped_at = Clock::now();
      ::raise(SIGSTOP);
      start_ += Clock::now() - stopped_at;  // continued: so are they, below
    }
    signal_all(SIGCONT);
  }

  // The first child failed, or the timeout passed: the children have had their SIGTERM.
  bool stopping_after_failure() const { return failed_rank_ >= 0 || failure_.has_value(); }

  // `sig` to the process group of every child still running.
  void signal_all(int sig) {
    for (auto& c : children_)
      if (c.alive) ::kill(-c.pid, sig);
  }

  void kill_all() {
    signal_all(SIGKILL);
    kill_at_.reset();
  }

  // How a failure's message ends when a signal killed the children it stopped.
  std::string killed_on_signal_text(int stopped) const {
    if (!killed_on_signal_) return "";
    return fmt::format(", then killed {} on the {} spawn was sent", stopped == 1 ? "it" : "them",
                       distributed::signal_name(signalled_));
  }

  void stop(int sig) {
    stopped_ = alive();
    signal_all(sig);
    signal_all(SIGCONT);  // a stopped child acts on SIGTERM only once it runs
    kill_at_ = Clock::now() + options_.grace_period;
  }

  std::vector<Child>& children_;
  const SpawnOptions& options_;
  std::optional<SpawnError> failure_;  // a timeout
  int failed_rank_ = -1;               // the first child that ended in failure
  int stopped_ = 0;                    // children still running when we stopped them
  std::optional<Clock::time_point> kill_at_;
  const StopSignalsCaught& signals_;
  std::function<void(int, const std::string&)> on_exited_;
  int signalled_ = 0;
  bool killed_on_signal_ = false;  // the first signal came while the children stopped
  Clock::time_point start_;         // the timeout counts from here
};

// Stops and reaps children already started when spawn cannot go on.
void abandon(std::vector<Child>& children) {
  for (auto& c : children) {
    close_fd(c.go_fd);  // a child still waiting for the port exits
    ::kill(-c.pid, SIGKILL);
  }
  for (auto& c : children) {
    int status = 0;
    while (::waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
    }
    close_fd(c.error_fd);
    close_fd(c.pid_fd);
  }
}

// The parent holds three descriptors per child (its socket pair's end, its
// error pipe's, its pidfd) and, serving the store, a connection per child;
// besides those a few of its own (the store's listening socket, epoll and
// eventfd, the exit recorder's connection at both ends).
// Room for them all before the first fork, as lockstep-run makes its own:
// past the open-file limit, a pipe or a connection would fail halfway.
void make_room_for_children(int nprocs) {
  constexpr long kPerChild = 4;
  constexpr long kOwn = 16;
  const long needed = kPerChild * nprocs + kOwn;
  const runtime::OpenFileRoom room = runtime::make_room_for_descriptors(needed);
  LOCKSTEP_CHECK(room.enough,
                 "spawn: {} processes need about {} more open files in the parent, but {} or "
                 "spawn fewer",
                 nprocs, needed, runtime::room_shortfall(room));
}

// Options that cannot mean what the caller wants, refused before any child
// starts: a timeout of 0 would stop every child at once (0 does not mean
// none here), and a variable spawn sets per rank would make each child
// another rank or another job's.
void check_options(const SpawnOptions& options) {
  if (options.timeout) {
    LOCKSTEP_CHECK(options.timeout->count() > 0,
                   "spawn: SpawnOptions::timeout is {} ms; give a positive time, or leave it "
                   "empty (std::nullopt) for none",
                   options.timeout->count());
  }
  LOCKSTEP_CHECK(options.grace_period.count() >= 0,
                 "spawn: SpawnOptions::grace_period is {} ms; give 0 or more",
                 options.grace_period.count());
  const auto own_variables = distributed::rank_variables({}, 1);
  for (const auto& [name, value] : options.env) {
    LOCKSTEP_CHECK(!name.empty() && name.find_first_of(std::string("=\0", 2)) == std::string::npos,
                   "spawn: SpawnOptions::env: '{}' is not a variable name", name);
    for (const auto& [own, unused] : own_variables) {
      LOCKSTEP_CHECK(name != own,
                     "spawn: SpawnOptions::env sets {}, which spawn sets for each rank itself "
                     "(from the rank, nprocs and the store it serves)",
                     name);
    }
  }
}

}  // namespace

void spawn(int nprocs, const std::function<void(int rank)>& fn, const SpawnOptions& options) {
  LOCKSTEP_CHECK(nprocs >= 1, "spawn: nprocs must be at least 1, got {}", nprocs);
  LOCKSTEP_CHECK(static_cast<bool>(fn), "spawn: fn is empty; give the function each rank runs");
  check_options(options);
  make_room_for_children(nprocs);
  const std::string token = distributed::random_token();
  const bool one_thread = std::getenv("OMP_NUM_THREADS") == nullptr;
  const pid_t parent = ::getpid();
  const ChildStatusKept keep_statuses;
  // Output buffered now would be written again by every child.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);

  std::vector<Child> children;
  children.reserve(static_cast<size_t>(nprocs));
  for (int rank = 0; rank < nprocs; ++rank) {
    int go[2], error[2];
    // The port goes over a socket pair, not a pipe: send() with MSG_NOSIGNAL
    // to a child that died first gives EPIPE instead of killing this process
    // with SIGPIPE.
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, go) != 0 ||
        ::pipe2(error, O_CLOEXEC) != 0) {
      const std::string why = std::strerror(errno);
      abandon(children);
      throw Error(fmt::format("spawn: cannot make a pipe for rank {}: {}", rank, why));
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      for (auto& c : children) {  // the parent's ends of the earlier children's pipes
        ::close(c.go_fd);
        ::close(c.error_fd);
        if (c.pid_fd >= 0) ::close(c.pid_fd);
      }
      ::close(go[1]);
      ::close(error[0]);
      run_child(rank, nprocs, parent, go[0], error[1], token, one_thread, fn, options);
    }
    ::close(go[0]);
    ::close(error[1]);
    if (pid < 0) {
      const std::string why = std::strerror(errno);
      ::close(go[1]);
      ::close(error[0]);
      abandon(children);
      throw Error(fmt::format("spawn: cannot start rank {} of {}: fork failed: {}", rank, nprocs,
                              why));
    }
    ::setpgid(pid, pid);  // as the child does: whichever runs first
    Child c;
    c.rank = rank;
    c.pid = pid;
    c.go_fd = go[1];
    c.error_fd = error[0];
    c.pid_fd = open_pidfd(pid);
    ::fcntl(c.error_fd, F_SETFL, ::fcntl(c.error_fd, F_GETFL) | O_NONBLOCK);
    children.push_back(c);
  }

  // The store, served from this process's thread once the children exist (so
  // none of them holds its sockets), and its port sent to each.
  std::unique_ptr<distributed::TcpStoreServer> server;
  try {
    distributed::TcpStoreServerOptions server_options;
    server_options.host = "127.0.0.1";
    server_options.token = token;
    server = std::make_unique<distributed::TcpStoreServer>(server_options);
  } catch (...) {
    abandon(children);
    throw;
  }
  const std::string port = fmt::format("{}\n", server->port());
  for (auto& c : children) {
    // A child that is already gone misses its port; its exit is reported below.
    (void)::send(c.go_fd, port.data(), port.size(), MSG_NOSIGNAL);
    close_fd(c.go_fd);
  }

  distributed::ExitRecorder exits({.port = server->port(), .token = token});
  StopSignalsCaught signals;
  Supervisor supervisor(children, options, signals, [&](int rank, const std::string& how) {
    exits.record(0, {.rank = rank, .how = how});
  });
  std::optional<SpawnError> failure = supervisor.run();
  for (auto& c : children) {
    close_fd(c.error_fd);
    close_fd(c.pid_fd);
  }
  if (supervisor.signalled() != 0) signals.raise_again(supervisor.signalled());
  if (failure) throw *failure;
}

}  // namespace lockstep::collectives
