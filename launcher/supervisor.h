// The supervisor loop: waits for the ranks of this node, relays their output,
// and stops them all when one fails or the launcher is signalled.
//
// One thread, one poll() over a signalfd (SIGCHLD, SIGINT, SIGTERM, SIGHUP,
// SIGTSTP, SIGCONT, SIGUSR1, SIGUSR2), the ranks' output pipes and an
// optional "another node failed" fd, so the first failure is noticed at once.
// Stopping: SIGTERM (or the received signal) to every rank's process group,
// SIGKILL to those still running after the grace period; a second
// SIGINT/SIGTERM, or a first while they stop after a failure, kills at once.
// SIGTSTP (Ctrl-Z) stops the ranks and then the launcher; SIGCONT (fg)
// continues them. SIGUSR1 and SIGUSR2 are passed on to every rank's process
// group, and the job runs on.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "launcher/spawn.h"

namespace lockstep::launcher {

// Blocks the signals the supervisor handles in the calling thread. Call it
// first in main, before any thread starts, so every thread inherits the mask
// and the signals wait for the supervisor's signalfd.
void block_supervisor_signals();

struct RankProcess {
  int rank = 0;
  int local_rank = 0;
  SpawnedChild child;
};

struct SupervisorOptions {
  std::chrono::milliseconds grace_period{5000};
  // A rank that beat once (runtime/liveness.h) and then sends no beat, or
  // only "no progress" beats, for this long is hung: reported as a failure
  // of that rank. "No progress" does not count while the launcher's output
  // takes no more data (the rank may be blocked writing). 0: not watched.
  std::chrono::milliseconds hang_timeout{0};
  int node_rank = 0;
  std::string hostname;
  // Readable when another node's rank failed; `remote_failure()` then says
  // which, and this node stops its ranks. -1: one node.
  int remote_failure_fd = -1;
  std::function<std::string()> remote_failure;
  // Called once with the message when a rank of this node fails first, or
  // the launcher is signalled first (then on_signalled before it), after the
  // ranks were told to stop. on_signalled: once, at the first stop signal,
  // also one that comes while the ranks stop after a failure.
  std::function<void(const std::string&)> on_local_failure;
  std::function<void(const std::string&)> on_signalled;
  // Called once with what stopped the job (a rank's failure or hang, another
  // node's failure, a signal) just before the ranks are told to stop, while
  // they are still as the failure found them: the post-mortem reads them.
  std::function<void(const std::string&)> before_stop;
  // Called with a rank and how it ended when it exits 0 while others still
  // run: the others may be waiting for it to join their group.
  std::function<void(int rank, const std::string& how)> on_rank_exited;
  // Whether a process group holds a process that is not a zombie
  // (process_identity.h; replaced by tests to count its /proc scans). Asked
  // only while kill(-pgid, 0) finds the group, and then at most once per
  // group per second after the first second.
  std::function<bool(pid_t pgid)> group_has_living;
};

// How a supervised attempt ended, for the restart decision.
enum class Outcome {
  succeeded,       // every rank exited 0
  rank_failed,     // a rank of this node failed first (`failure` says which and how)
  remote_failed,   // another node reported a failure first
  signalled,       // the launcher was told to stop (SIGINT, SIGTERM, SIGHUP)
};

struct SupervisorResult {
  // The launcher's exit code: 0 when all exited 0, else the first failing
  // rank's code (128 + signal when killed by one; 128 + the signal the
  // launcher received when it was stopped; 1 for another node's failure).
  int exit_code = 0;
  Outcome outcome = Outcome::succeeded;
  std::string failure;  // what failed first, as printed; empty on success
  // The first SIGINT, SIGTERM or SIGHUP the launcher received, or 0. Set too
  // when it came while the ranks stopped after a failure: no restart then.
  int stop_signal = 0;
};

// Runs until every rank has exited.
SupervisorResult supervise(std::vector<RankProcess> ranks, const SupervisorOptions& options);

// Waits `delay` (a restart's backoff) unless SIGINT, SIGTERM or SIGHUP comes
// first; returns that signal's number, or 0 when the time passed.
int wait_unless_signalled(std::chrono::milliseconds delay);

}  // namespace lockstep::launcher
