// supervisor_probe: runs the launcher's supervisor loop (launcher/supervisor.h)
// over one child that waits to be stopped, with events made ready before the
// loop starts, so that they all arrive in its first poll() wake-up. Prints
// "exit_code=C outcome=O stop_signal=G told=T before_stop=N scans=S" (T: how
// often the other nodes were told of a stop signal; N: how often the job was
// stopped; S: how often the rank's process group was looked for in /proc).
//   signal-and-remote  SIGTERM to the launcher and another node's failure
//   lingering-group    the child leaves a process that ignores SIGTERM in its
//                      group and exits 3; grace period 3 s
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "launcher/process_identity.h"
#include "launcher/supervisor.h"

namespace {

const char* outcome_name(lockstep::launcher::Outcome outcome) {
  using lockstep::launcher::Outcome;
  switch (outcome) {
    case Outcome::succeeded: return "succeeded";
    case Outcome::rank_failed: return "rank_failed";
    case Outcome::remote_failed: return "remote_failed";
    case Outcome::signalled: return "signalled";
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace lockstep::launcher;
  const std::string mode = argc > 1 ? argv[1] : "";
  const bool lingering = mode == "lingering-group";
  if (mode != "signal-and-remote" && !lingering) {
    fmt::print(stderr, "usage: supervisor_probe signal-and-remote|lingering-group\n");
    return 2;
  }
  block_supervisor_signals();
  const pid_t pid = fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (lingering) {
      int ready[2];
      if (pipe(ready) != 0) _exit(1);
      if (fork() == 0) {
        signal(SIGTERM, SIG_IGN);
        const char byte = 1;
        if (write(ready[1], &byte, 1) != 1) _exit(1);
        for (;;) pause();
      }
      char byte;
      _exit(read(ready[0], &byte, 1) == 1 ? 3 : 1);
    }
    for (;;) pause();
  }
  setpgid(pid, pid);

  const int remote = eventfd(lingering ? 0 : 1, EFD_CLOEXEC | EFD_NONBLOCK);
  if (!lingering) raise(SIGTERM);  // blocked: waits for the supervisor's signalfd
  int stops = 0, scans = 0, told = 0;
  SupervisorOptions options;
  options.grace_period = std::chrono::milliseconds(lingering ? 3000 : 2000);
  options.hostname = "probe";
  options.remote_failure_fd = remote;
  options.remote_failure = [] { return std::string("node 1: rank 1 failed"); };
  options.before_stop = [&](const std::string&) { ++stops; };
  options.on_signalled = [&](const std::string&) { ++told; };
  options.group_has_living = [&](pid_t pgid) {
    ++scans;
    return group_has_living(pgid);
  };
  RankProcess rank;
  rank.child.pid = pid;
  const SupervisorResult result = supervise({rank}, options);
  fmt::print("exit_code={} outcome={} stop_signal={} told={} before_stop={} scans={}\n",
             result.exit_code, outcome_name(result.outcome), result.stop_signal, told, stops,
             scans);
  return 0;
}
