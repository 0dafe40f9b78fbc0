// Starting one rank: find the program like execvp does, then fork and exec it
// in its own process group with its own environment.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace lockstep::launcher {

// The program's path: `name` itself when it contains a '/', else the first
// executable file named `name` in `path` (a PATH value). nullopt when none.
std::optional<std::string> find_program(const std::string& name, const std::string& path);
// Why find_program found nothing, to follow "program 'NAME' ": "not found in
// PATH; ./NAME is here: start it as ./NAME", "is not executable (chmod +x
// it)", ...
std::string why_not_found(const std::string& name);
// Why the kernel would refuse to run `program` (a path find_program returned)
// although it is an executable file, to follow "program 'NAME' ": its "#!"
// line names an interpreter that is missing or not executable (execve then
// says only "No such file or directory", of a file that is there), or it is
// a Python script (NAME.py) without one, which /bin/sh would run. nullopt
// when its interpreter, if any, can be run.
std::optional<std::string> why_interpreter_fails(const std::string& program);

// Where a child's stdout and stderr go: ours (none), a pipe each the
// launcher reads (separate), or one pipe for both (merged, as when ours
// are one file: 2>&1).
enum class Capture { none, separate, merged };

struct SpawnedChild {
  pid_t pid = -1;  // also its process group id
  int stdout_fd = -1;  // read ends of its output pipes; -1 when it inherits ours
  int stderr_fd = -1;  // -1 too when merged into stdout_fd's
  int heartbeat_fd = -1;  // our end of its heartbeat socket (runtime/liveness.h); -1: none
};

// The descriptor a rank finds its heartbeat socket at (LOCKSTEP_HEARTBEAT_FD).
inline constexpr int kChildHeartbeatFd = 3;

// Forks and execs `program` with `argv` (argv[0] included) and `env`. The
// child leads its own process group, so the launcher alone receives a
// terminal's Ctrl-C and forwards it once, and stopping a rank stops whatever
// it started too. It dies with the launcher (PR_SET_PDEATHSIG; the rest of
// its group is GroupReaper's), reads stdin from /dev/null, and writes its
// output as `capture` says. The caller must have
// blocked the signals it handles (see supervisor.h); the child starts with no
// signal blocked and every signal at its default disposition, whatever the
// launcher inherited. With `cpus` non-empty the child runs only on those
// CPUs. With `heartbeat` the child gets one end of a datagram socket pair as
// descriptor kChildHeartbeatFd, and the parent the other (non-blocking).
// Exec (or binding) failure: the child prints why and exits 127 (no such
// file) or 126 (it cannot run). A file the kernel does not know how to run
// runs under /bin/sh, as execvp runs it, unless it reads as binary (a
// program for another architecture) or has a #! line (its interpreter is
// such a program): then "Exec format error", 126.
SpawnedChild spawn_child(const std::string& program, const std::vector<std::string>& argv,
                         const std::vector<std::string>& env, Capture capture,
                         const std::vector<int>& cpus = {}, bool heartbeat = false);

}  // namespace lockstep::launcher
