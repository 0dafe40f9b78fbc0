#include "launcher/supervisor.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "launcher/line_tagger.h"
#include "launcher/output_queue.h"
#include "launcher/process_identity.h"
#include "lockstep/runtime/error.h"
#include "lockstep/distributed/exit_status.h"

namespace lockstep::launcher {
namespace {

using distributed::describe_wait_status;
using distributed::ended_in_failure;
using distributed::exit_code_of;
using distributed::signal_name;

using Clock = std::chrono::steady_clock;

// How often the loop looks for hung ranks while it watches heartbeats.
constexpr int kHangCheckMs = 100;
// A lingering group's /proc scan (group_has_living: every process's stat
// file, thousands on a busy node) is repeated after these waits, doubling:
// the cheap kill(-pgid, 0) on every tick sees the group end at once, the
// scan tells only a group left with zombies from one still alive.
constexpr Clock::duration kFirstScanWait = std::chrono::milliseconds(100);
constexpr Clock::duration kLongestScanWait = std::chrono::seconds(1);

sigset_t handled_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGTSTP, SIGCONT, SIGUSR1, SIGUSR2})
    sigaddset(&set, sig);
  return set;
}

// Passed on to the ranks, which go on running, as mpirun does: a batch
// system's warning before a time limit (Slurm's --signal=B:USR1@90), on which
// a program saves a checkpoint. Their default action would end the launcher,
// and with it every rank (SIGKILL), before any could save.
bool is_forwarded(int sig) { return sig == SIGUSR1 || sig == SIGUSR2; }

// Ctrl-Z and fg, as mpirun does them: the ranks lead process groups of their
// own, so the terminal's SIGTSTP reaches only the launcher.
bool is_job_control(int sig) { return sig == SIGTSTP || sig == SIGCONT; }

void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 100);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return;  // e.g. EPIPE: nobody reads our output any more
    }
  }
}

std::string ranks_word(int n) { return n == 1 ? "1 rank" : fmt::format("{} ranks", n); }

// One captured output stream of one rank.
struct Stream {
  pid_t pid;  // of the rank that writes it
  int fd;
  OutputQueue* target;  // the launcher's stdout or stderr
  LineTagger tagger;
};

// Whether `fd` would block a write now (a pipe nobody reads has filled up).
bool write_would_block(int fd) {
  pollfd p{fd, POLLOUT, 0};
  return poll(&p, 1, 0) == 0;
}

struct Tracked {
  RankProcess process;
  bool alive = true;
  // Its process group had no process left once the rank had ended; it never
  // has one again, and its id may be another group's later.
  bool group_gone = false;
  // From its heartbeats; unset until the first (the rank joined its group).
  std::optional<Clock::time_point> last_beat, last_progress;
  // While no beat is expected: since when its process was seen stopped.
  std::optional<Clock::time_point> stopped_since;
  // Scanning /proc for its group's living processes: when next, and the
  // wait after that (doubled each time, up to kLongestScanWait).
  Clock::time_point next_scan{};
  Clock::duration scan_wait = kFirstScanWait;
};

class Supervisor {
 public:
  Supervisor(std::vector<RankProcess> ranks, const SupervisorOptions& options)
      : options_(options) {
    const bool tagged = std::any_of(ranks.begin(), ranks.end(),
                                    [](const RankProcess& r) { return r.child.stdout_fd >= 0; });
    if (tagged) {
      queues_.push_back(std::make_unique<OutputQueue>(STDOUT_FILENO));
      // One queue when both are the same file (2>&1): two would interleave
      // the parts of lines they write when it is full.
      if (!same_file(STDOUT_FILENO, STDERR_FILENO))
        queues_.push_back(std::make_unique<OutputQueue>(STDERR_FILENO));
      out_ = queues_.front().get();
      err_ = queues_.back().get();
    }
    for (auto& r : ranks) {
      const std::string prefix = fmt::format("[rank {}] ", r.rank);
      const pid_t pid = r.child.pid;
      if (r.child.stdout_fd >= 0)
        streams_.push_back({pid, r.child.stdout_fd, out_, LineTagger(prefix)});
      if (r.child.stderr_fd >= 0)
        streams_.push_back({pid, r.child.stderr_fd, err_, LineTagger(prefix)});
      ranks_.push_back({r, true});
    }
    const sigset_t set = handled_signals();
    signal_fd_ = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    LOCKSTEP_CHECK(signal_fd_ >= 0, "signalfd failed: {}", strerror(errno));
  }
  ~Supervisor() {
    for (auto& s : streams_) close(s.fd);
    for (auto& r : ranks_)
      if (r.process.child.heartbeat_fd >= 0) close(r.process.child.heartbeat_fd);
    close(signal_fd_);
  }

  SupervisorResult run() {
    reap();  // a rank may have ended before the loop started
    for (;;) {
      const auto now = Clock::now();
      if (kill_at_ && now >= *kill_at_) {
        kill_remaining(/*after_grace=*/true);
        kill_at_.reset();
      }
      close_unread_streams();
      if (alive() == 0) {
        // Whatever the ranks left in the pipes; a lingering grandchild holding
        // one open does not keep the launcher waiting for long.
        if (!drain_until_) drain_until_ = now + std::chrono::seconds(1);
        if (now >= *drain_until_) close_drained_streams();
        if (const auto at = give_up_on_reader_at(); at && now >= *at) {
          say(fmt::format("nothing of the ranks' output was read for {:g} s after {}; "
                          "dropping the {} bytes not yet read",
                          std::chrono::duration<double>(options_.grace_period).count(),
                          signal_name(result_.stop_signal), drop_output()));
        }
        // Then what is queued for our own output, unless a signal said not to;
        // and while stopping, what the ranks started, until the grace period ends.
        if (streams_.empty() && (abandoned_ || !output_pending()) && !group_lingers()) break;
      }
      std::vector<pollfd> fds = {{signal_fd_, POLLIN, 0}};
      const bool watch_remote = options_.remote_failure_fd >= 0 && !stopping_;
      if (watch_remote) fds.push_back({options_.remote_failure_fd, POLLIN, 0});
      const bool watch_hangs = options_.hang_timeout.count() > 0 && !stopping_;
      std::vector<size_t> beating;  // ranks_ index of each heartbeat fd polled
      if (watch_hangs) {
        for (size_t i = 0; i < ranks_.size(); ++i) {
          if (!ranks_[i].alive || ranks_[i].process.child.heartbeat_fd < 0) continue;
          fds.push_back({ranks_[i].process.child.heartbeat_fd, POLLIN, 0});
          beating.push_back(i);
        }
      }
      const size_t first_beat = fds.size() - beating.size();
      // A stream whose queue is full is not read: its rank's writes block.
      std::vector<size_t> reading;  // streams_ index of each pipe polled
      for (size_t i = 0; i < streams_.size(); ++i) {
        if (streams_[i].target->full()) continue;
        fds.push_back({streams_[i].fd, POLLIN, 0});
        reading.push_back(i);
      }
      const size_t first_stream = fds.size() - reading.size();
      std::vector<OutputQueue*> writing;
      for (const auto& q : queues_) {
        if (q->empty() || abandoned_) continue;
        fds.push_back({q->fd(), POLLOUT, 0});
        writing.push_back(q.get());
      }
      const size_t first_queue = fds.size() - writing.size();

      // A rank's group is not ours to wait for: looked at again every 100 ms.
      int timeout_ms = watch_hangs || (alive() == 0 && group_lingers()) ? kHangCheckMs : -1;
      for (const auto& at : {kill_at_, streams_.empty() ? std::nullopt : drain_until_,
                             alive() == 0 ? give_up_on_reader_at() : std::nullopt}) {
        if (!at) continue;
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(*at - now).count();
        // Past the drain deadline, a stream left open waits for its full queue.
        const int ms = static_cast<int>(left > 0 ? left : at == kill_at_ ? 0 : kHangCheckMs);
        timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
      }
      if (poll(fds.data(), fds.size(), timeout_ms) < 0) {
        LOCKSTEP_CHECK(errno == EINTR, "poll failed: {}", strerror(errno));
        continue;
      }
      if (fds[0].revents) read_signals();
      // The first outcome wins: a failure or signal handled just above stands.
      if (watch_remote && !stopping_ && fds[1].revents) on_remote_failure();
      for (size_t b = 0; b < beating.size(); ++b) {
        if (fds[first_beat + b].revents) read_beats(ranks_[beating[b]]);
      }
      if (watch_hangs && !stopping_) find_hung_rank();
      for (size_t q = 0; q < writing.size(); ++q) {
        if (!fds[first_queue + q].revents) continue;
        const size_t before = writing[q]->size();
        writing[q]->flush();
        if (writing[q]->size() < before) output_taken_at_ = Clock::now();
      }
      // Back to front, so closing a stream does not shift the ones not yet seen.
      for (size_t i = reading.size(); i-- > 0;) {
        if (fds[first_stream + i].revents) pump(reading[i]);
      }
    }
    return result_;
  }

 private:
  void say(const std::string& message) {
    const std::string line = "lockstep-run: " + message + "\n";
    if (err_) err_->push(line);
    else write_all(STDERR_FILENO, line);
  }

  bool output_pending() const {
    return std::any_of(queues_.begin(), queues_.end(), [](const auto& q) { return !q->empty(); });
  }

  // Told to stop, the launcher waits for a reader of the ranks' output only
  // while it takes some: one that took nothing for the grace period (a paused
  // pager, a fifo nobody reads) is given up on then. Without a stop signal
  // the output waits for its reader, as a program's own would.
  std::optional<Clock::time_point> give_up_on_reader_at() const {
    if (result_.stop_signal == 0 || abandoned_ || !output_pending()) return std::nullopt;
    return std::max(stop_signal_at_, output_taken_at_) + options_.grace_period;
  }

  // Drops what is queued for our output and stops reading the ranks' pipes:
  // nobody will read it. Returns how many bytes were dropped.
  size_t drop_output() {
    abandoned_ = true;
    for (auto& s : streams_) close(s.fd);
    streams_.clear();
    size_t dropped = 0;
    for (const auto& q : queues_) {
      dropped += q->size();
      q->discard();
    }
    return dropped;
  }

  // Whether the ranks' writes may be blocked by whoever reads our output: a
  // rank blocked in write() uses no CPU, yet is not hung. Tagging: a full
  // queue, whose pipes are not read. Else the ranks write to our stdout and
  // stderr themselves.
  bool output_stalled() const {
    if (!queues_.empty())
      return std::any_of(queues_.begin(), queues_.end(), [](const auto& q) { return q->full(); });
    return write_would_block(STDOUT_FILENO) || write_would_block(STDERR_FILENO);
  }

  // Once every rank has exited: closes the streams that hold nothing more
  // (a lingering grandchild may hold the pipe open), tagging what is left.
  void close_drained_streams() {
    for (size_t i = streams_.size(); i-- > 0;) {
      if (streams_[i].target->full()) continue;
      pump(i);
      if (i >= streams_.size() || streams_[i].target->full()) continue;
      Stream& s = streams_[i];
      s.target->push(s.tagger.finish());
      close(s.fd);
      streams_.erase(streams_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }

  // Closes the pipes whose output nobody would read (our reader is gone, as
  // `| head` leaves it), so the rank's next write to them fails with SIGPIPE
  // as it would without --tag-output; reading them on would let the ranks
  // run on unseen, and the job never end.
  void close_unread_streams() {
    for (size_t i = streams_.size(); i-- > 0;) {
      if (!streams_[i].target->closed()) continue;
      close(streams_[i].fd);
      streams_.erase(streams_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }

  // While the job is stopped, within the grace period: whether a process is
  // left in a rank's process group after its rank ended (what it started: a
  // data loader's worker, the program a wrapper script runs). It gets the
  // grace period the ranks get, then SIGKILL, or it would outlive the job.
  bool group_lingers() {
    if (!stopping_ || !kill_at_) return false;
    bool lingers = false;
    for (auto& r : ranks_) {
      if (!r.alive && !look_for_group(r)) lingers = true;
    }
    return lingers;
  }

  // After its rank ended: whether its process group is gone (noted for good).
  // A group left with only zombies is gone: their parent, outside the group
  // (a container's init that does not reap), may never wait for them. That
  // takes a /proc scan, done again only after a wait that grows to 1 s
  // (unless `scan_now`).
  bool look_for_group(Tracked& r, bool scan_now = false) {
    if (r.group_gone) return true;
    const pid_t pgid = r.process.child.pid;
    if (kill(-pgid, 0) != 0 && errno == ESRCH) return r.group_gone = true;
    const auto now = Clock::now();
    if (now < r.next_scan && !scan_now) return false;
    r.next_scan = now + r.scan_wait;
    r.scan_wait = std::min(2 * r.scan_wait, kLongestScanWait);
    const bool living = options_.group_has_living ? options_.group_has_living(pgid)
                                                  : group_has_living(pgid);
    return r.group_gone = !living;
  }

  int alive() const {
    int n = 0;
    for (const auto& r : ranks_) n += r.alive ? 1 : 0;
    return n;
  }

  void read_signals() {
    signalfd_siginfo info{};
    while (read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) {
        reap();
      } else if (is_job_control(sig)) {
        if (!stopping_) job_control(sig);
      } else if (is_forwarded(sig)) {
        if (stopping_ || alive() == 0) continue;
        say(fmt::format("received {}; forwarding it to {}", signal_name(sig), ranks_word(alive())));
        for (const auto& r : ranks_) {
          if (r.alive) kill(-r.process.child.pid, sig);
        }
      } else if (alive() == 0 && output_pending()) {
        // Every rank is done; only a stalled reader of our output keeps us.
        say(fmt::format("received {}; dropping {} bytes of the ranks' output not yet read",
                        signal_name(sig), drop_output()));
        // The ranks here are done (nothing to stop), the job may not be
        // elsewhere: the other nodes stop theirs at once instead of finding
        // this launcher gone (after a failure, they were told of it).
        const bool first = !stopping_;
        if (first) result_ = {128 + sig, Outcome::signalled, told_by(sig)};
        told_to_stop(sig);
        if (first && options_.on_local_failure) options_.on_local_failure(result_.failure);
      } else if (!stopping_) {
        const std::string why = told_by(sig);
        say(fmt::format("received {}; forwarding it to {}", signal_name(sig), ranks_word(alive())));
        result_ = {128 + sig, Outcome::signalled, why};
        // The ranks first: telling the other nodes may wait on node 0.
        stop(sig);
        told_to_stop(sig);
        if (options_.on_local_failure) options_.on_local_failure(why);
      } else {
        // Stopping after a failure, the user's first stop signal: no restart.
        say(fmt::format("received {} {}", signal_name(sig),
                        result_.stop_signal != 0 ? "again; killing the ranks"
                                                 : "while the ranks stop; killing them now"));
        kill_remaining(/*after_grace=*/false);
        kill_at_.reset();
        told_to_stop(sig);
      }
    }
  }

  // SIGTSTP: stops every rank, then the launcher itself; the SIGCONT that
  // continues the launcher (fg, bg, kill -CONT) continues them. Their
  // heartbeats start afresh: a stopped job is not a hung one.
  void job_control(int sig) {
    const int n = alive();
    if (sig == SIGTSTP) {
      say(fmt::format("received SIGTSTP; stopping {} (fg or SIGCONT resumes them)", ranks_word(n)));
      for (const auto& r : ranks_) {
        if (r.alive) kill(-r.process.child.pid, SIGSTOP);
      }
      for (const auto& q : queues_) q->flush();  // the message, if the reader takes it
      raise(SIGSTOP);
      return;  // the SIGCONT that woke us is read next
    }
    for (const auto& r : ranks_) {
      if (r.alive) kill(-r.process.child.pid, SIGCONT);
    }
    const auto now = Clock::now();
    for (auto& r : ranks_) {
      if (r.last_beat) r.last_beat = r.last_progress = now;
      r.stopped_since.reset();
    }
  }

  void reap() {
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (auto& r : ranks_) {
        if (r.process.child.pid == pid && r.alive) {
          r.alive = false;
          look_for_group(r);
          // What it wrote before it ended (its error) comes before what we
          // say of its end.
          for (auto& s : streams_) {
            if (s.pid == pid) read_stream(s);
          }
          if (ended_in_failure(status) && !stopping_) {
            on_first_failure(r, status);
          } else if (!stopping_ && alive() > 0 && options_.on_rank_exited) {
            options_.on_rank_exited(r.process.rank, describe_wait_status(status));
          }
        }
      }
    }
  }

  void on_first_failure(const Tracked& r, int status) {
    const auto& p = r.process;
    const std::string what = fmt::format("rank {} (local rank {} on node {}, host {}, pid {}) {}",
                                         p.rank, p.local_rank, options_.node_rank,
                                         options_.hostname, p.child.pid,
                                         describe_wait_status(status));
    const int others = alive();
    say(others > 0 ? fmt::format("{}; stopping the other {}", what, ranks_word(others)) : what);
    result_ = {exit_code_of(status), Outcome::rank_failed, what, result_.stop_signal};
    stop(SIGTERM);  // before telling the other nodes, which may wait on node 0
    if (options_.on_local_failure) options_.on_local_failure(what);
  }

  // One datagram is one beat: 'P' progress, 'I' none, 'L' the beating
  // program is leaving (runtime/liveness.h), so no beat is expected until
  // another comes.
  void read_beats(Tracked& r) {
    char beat;
    while (recv(r.process.child.heartbeat_fd, &beat, 1, MSG_DONTWAIT) > 0) {
      if (beat == 'L') {
        r.last_beat.reset();
        r.last_progress.reset();
        continue;
      }
      const auto now = Clock::now();
      r.last_beat = now;
      r.stopped_since.reset();
      if (!r.last_progress || beat == 'P') r.last_progress = now;
    }
  }

  // The first rank that stopped beating, or beats "no progress", for longer
  // than the hang timeout; stops the job as a failure of that rank. A rank
  // that beats no more, or not yet (its program has not joined its group,
  // and may never: it may not be a lockstep program), is hung only when its
  // process stays stopped (SIGSTOP, a debugger) that long: one stopped before
  // its first beat is found as soon as one stopped later, and one that works
  // for long before it joins is not called hung.
  void find_hung_rank() {
    const auto now = Clock::now();
    const bool stalled = output_stalled();
    for (auto& r : ranks_) {
      if (!r.alive) continue;
      if (!r.last_beat) {
        if (!process_stopped(r.process.child.pid)) {
          r.stopped_since.reset();
        } else if (!r.stopped_since) {
          r.stopped_since = now;
        } else if (now - *r.stopped_since > options_.hang_timeout) {
          on_hung(r, fmt::format("has been stopped (SIGSTOP, a debugger) for {:.1f} s, with no "
                                 "heartbeat expected (its program had not joined its group, or "
                                 "had left it)",
                                 seconds(now - *r.stopped_since)));
          return;
        }
        continue;
      }
      if (stalled) r.last_progress = now;  // blocked writing its output, maybe
      const auto silent = now - *r.last_beat, idle = now - *r.last_progress;
      std::string why;
      if (silent > options_.hang_timeout) {
        why = fmt::format("sent no heartbeat for {:.1f} s: it is stopped (SIGSTOP, a debugger) "
                          "or frozen", seconds(silent));
      } else if (idle > options_.hang_timeout) {
        why = fmt::format("made no progress for {:.1f} s: it used no CPU and was not waiting "
                          "for other ranks or reading or writing a file (a deadlock?)",
                          seconds(idle));
      } else {
        continue;
      }
      on_hung(r, why);
      return;
    }
  }

  static double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

  void on_hung(const Tracked& r, const std::string& why) {
    const auto& p = r.process;
    const std::string what = fmt::format(
        "rank {} (local rank {} on node {}, host {}, pid {}) is hung: it {} (--hang-timeout {:g} s)",
        p.rank, p.local_rank, options_.node_rank, options_.hostname, p.child.pid, why,
        seconds(options_.hang_timeout));
    const int others = alive() - 1;
    say(others > 0 ? fmt::format("{}; killing it and stopping the other {}", what, ranks_word(others))
                   : fmt::format("{}; killing it", what));
    result_ = {1, Outcome::rank_failed, what, result_.stop_signal};
    stop(SIGTERM);
    kill(-p.child.pid, SIGKILL);  // a deadlocked rank may not act on SIGTERM
    if (options_.on_local_failure) options_.on_local_failure(what);
  }

  void on_remote_failure() {
    const std::string what = options_.remote_failure ? options_.remote_failure() : "another node failed";
    say(fmt::format("{}; stopping the {} on node {}", what, ranks_word(alive()), options_.node_rank));
    result_ = {1, Outcome::remote_failed, what, result_.stop_signal};
    stop(SIGTERM);
  }

  std::string told_by(int sig) const {
    return fmt::format("node {}'s launcher received {}", options_.node_rank, signal_name(sig));
  }

  // The first stop signal is the user's verdict, whatever stopped the ranks
  // first: recorded, and the other nodes told not to restart.
  void told_to_stop(int sig) {
    if (result_.stop_signal != 0) return;
    result_.stop_signal = sig;
    stop_signal_at_ = Clock::now();
    if (options_.on_signalled) options_.on_signalled(told_by(sig));
  }

  void stop(int sig) {
    if (options_.before_stop) options_.before_stop(result_.failure);
    stopping_ = true;
    // Ranks that ended too: what they started may still run in their group
    // (the group outlives its leader while it has members; else ESRCH).
    for (const auto& r : ranks_) {
      if (r.group_gone) continue;
      kill(-r.process.child.pid, sig);
      // A stopped rank (SIGSTOP, a debugger gone) acts on the signal only once
      // it runs again; otherwise it would take the whole grace period.
      kill(-r.process.child.pid, SIGCONT);
    }
    kill_at_ = Clock::now() + options_.grace_period;
  }

  void kill_remaining(bool after_grace) {
    const double grace_s = std::chrono::duration<double>(options_.grace_period).count();
    for (auto& r : ranks_) {
      if (!r.alive) {
        if (look_for_group(r, /*scan_now=*/true)) continue;
        if (after_grace) {
          say(fmt::format("rank {} (pid {}) ended, but processes it started did not stop within "
                          "{:g} s; sending them SIGKILL",
                          r.process.rank, r.process.child.pid, grace_s));
        }
        kill(-r.process.child.pid, SIGKILL);
        continue;
      }
      if (after_grace) {
        say(fmt::format("rank {} (pid {}) did not stop within {:g} s; sending SIGKILL",
                        r.process.rank, r.process.child.pid, grace_s));
      }
      kill(-r.process.child.pid, SIGKILL);
    }
  }

  // Queues what one stream has now, tagged, until its queue is full (16
  // reads at most: one stream does not starve the others); at end of file
  // queues the partial line and returns false.
  static bool read_stream(Stream& s) {
    char buffer[65536];
    for (int round = 0; round < 16 && !s.target->full(); ++round) {
      const ssize_t n = read(s.fd, buffer, sizeof buffer);
      if (n > 0) {
        s.target->push(s.tagger.feed(std::string_view(buffer, static_cast<size_t>(n))));
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
      s.target->push(s.tagger.finish());
      return false;
    }
    return true;
  }

  // read_stream, dropping the stream at its end.
  void pump(size_t index) {
    if (read_stream(streams_[index])) return;
    close(streams_[index].fd);
    streams_.erase(streams_.begin() + static_cast<std::ptrdiff_t>(index));
  }

  SupervisorOptions options_;
  std::vector<Tracked> ranks_;
  // --tag-output: our stdout and stderr, non-blocking while they exist.
  // Declared before streams_, which point at them.
  std::vector<std::unique_ptr<OutputQueue>> queues_;
  OutputQueue* out_ = nullptr;  // of queues_
  OutputQueue* err_ = nullptr;  // of queues_; out_ when both are one file
  bool abandoned_ = false;  // our output is dropped: nobody reads it
  Clock::time_point output_taken_at_;  // when a reader last took some of it
  Clock::time_point stop_signal_at_;   // when result_.stop_signal came
  std::vector<Stream> streams_;
  int signal_fd_ = -1;
  bool stopping_ = false;
  std::optional<Clock::time_point> kill_at_;
  std::optional<Clock::time_point> drain_until_;
  SupervisorResult result_;
};

}  // namespace

void block_supervisor_signals() {
  const sigset_t set = handled_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the launcher
}

SupervisorResult supervise(std::vector<RankProcess> ranks, const SupervisorOptions& options) {
  return Supervisor(std::move(ranks), options).run();
}

int wait_unless_signalled(std::chrono::milliseconds delay) {
  const sigset_t set = handled_signals();
  const int fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  LOCKSTEP_CHECK(fd >= 0, "signalfd failed: {}", strerror(errno));
  const auto until = Clock::now() + delay;
  int received = 0;
  while (received == 0) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30))) < 0 && errno != EINTR) break;
    signalfd_siginfo info{};
    while (read(fd, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGTSTP) raise(SIGSTOP);  // no rank runs between attempts
      // SIGCHLD: a child of an earlier attempt, or the reaper. SIGUSR1 and
      // SIGUSR2 find no rank to pass them to.
      if (sig != SIGCHLD && !is_job_control(sig) && !is_forwarded(sig)) received = sig;
    }
  }
  close(fd);
  return received;
}

}  // namespace lockstep::launcher
