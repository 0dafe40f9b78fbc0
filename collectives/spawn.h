// spawn(): N ranks started from inside one program, as PyTorch's
// torch.multiprocessing.spawn(fn, nprocs=N, join=True) with the fork start
// method.
//
//   collectives::spawn(4, [&](int rank) {
//     auto group = collectives::init_process_group();   // rank `rank` of 4
//     ...train...
//   });
//
// Each child is a fork of the caller. It gets the variables
// init_process_group() reads (distributed::rank_variables(): rank r of N on one
// node, and a store this process serves on 127.0.0.1 for the call), runs
// fn(r) and exits 0, or 1 when fn throws, its message passed to the parent.
// The parent supervises as lockstep-run does: the first child to fail (an
// exception, a non-zero exit, a signal) stops the others (SIGTERM to each
// child's process group, SIGKILL after the grace period) and spawn throws
// SpawnError naming its rank, how it ended and its message; children still
// running at the timeout are a hang and end the same way. spawn returns when
// every child has exited 0.
//
// A SIGINT, SIGTERM or SIGHUP sent to this process while spawn waits (a
// terminal's Ctrl-C reaches this process alone, the children leading process
// groups of their own) is passed on to every child, as lockstep-run does, so
// that each rank may act on it (save its work) within the grace period; a
// second one kills them at once, as does one that comes while the children
// already stop after a failure or the timeout. When they have ended, the
// signal is raised again in this process under the caller's own handling: by
// default it ends the program as it would have; with a handler of the
// caller's, spawn then returns or throws as the children ended. Ctrl-Z
// (SIGTSTP) stops every child and then this process, and the SIGCONT that
// continues it (fg, bg) continues them; the time stopped does not count
// toward SpawnOptions::timeout. A signal the caller ignores stays ignored.
//
// Fork, not exec: a child starts with a copy of the caller's memory, so fn may
// capture anything, but call spawn before this process starts threads of its
// own or touches CUDA (a forked child cannot use its parent's CUDA context,
// as in PyTorch); each child picks its GPU as a lockstep-run rank does. The
// children share the caller's stdout and stderr, read stdin from /dev/null
// (as lockstep-run's ranks), each leads its own process group, and they die
// with the caller (PR_SET_PDEATHSIG). While spawn runs,
// an ignored SIGCHLD is set to its default, so the children's statuses stay
// to be collected. A child starts with
// no signal blocked and SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGPIPE and SIGCHLD
// at their defaults, whatever the caller had; fn may install its own. A child leaves with
// _exit once fn has returned and its output is flushed: what fn's scope owns
// is destroyed as usual, statics the child made are not (as Python's forked
// children). Unless OMP_NUM_THREADS is set, each child's CPU kernels run on
// one thread, as under lockstep-run; OMP_NUM_THREADS in SpawnOptions::env
// sets the children's count. The children are a job of their own, even in a
// program that lockstep-run started: they get no LOCKSTEP_RESTART_COUNT and
// no LOCKSTEP_JOB_ID from the caller (SpawnOptions::env may still set them),
// and send the launcher no heartbeat: its hang detector watches the rank that
// called spawn once that rank joins a group itself, not the children.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/runtime/error.h"

namespace lockstep::collectives {

struct SpawnOptions {
  // How long the children may run in all (positive); none: as long as they run.
  std::optional<std::chrono::milliseconds> timeout;
  // Between SIGTERM and SIGKILL when stopping the children.
  std::chrono::milliseconds grace_period{5000};
  // Set in every child before fn runs; the variables spawn sets for each rank
  // (RANK, WORLD_SIZE, LOCKSTEP_STORE_ADDR, ...: distributed::rank_variables)
  // are refused.
  std::vector<std::pair<std::string, std::string>> env;
};

class SpawnError : public Error {
 public:
  SpawnError(const std::string& what, int rank, int exit_code)
      : Error(what), rank_(rank), exit_code_(exit_code) {}
  // The first rank that failed; at a timeout, the lowest still running.
  int rank() const { return rank_; }
  // Its exit code (128 + the signal when one killed it); -1 at a timeout, or
  // when another waitpid in this process took the child's status.
  int exit_code() const { return exit_code_; }

 private:
  int rank_;
  int exit_code_;
};

// Runs fn(0) ... fn(nprocs - 1) in nprocs child processes and waits for them
// all. Throws SpawnError as above, and lockstep::Error when nprocs < 1 or a
// process or the store cannot be started (any child already started is
// stopped first).
void spawn(int nprocs, const std::function<void(int rank)>& fn, const SpawnOptions& options = {});

}  // namespace lockstep::collectives
