// Runs a program as a child process for multi-process tests: captures its
// stdout and stderr together, enforces a wall-clock limit (the child's whole
// process group is SIGKILLed when it passes, so a hang fails the test instead
// of blocking ctest), and reports how it ended.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace lockstep::testing {

struct ProcessResult {
  int exit_code = -1;      // when it exited normally, else -1
  int signal = 0;          // the signal that ended it, else 0
  bool timed_out = false;  // killed because it ran past the limit
  std::string output;      // stdout and stderr, interleaved as written
  double seconds = 0.0;    // how long it ran

  bool ok() const { return exit_code == 0 && !timed_out; }
};

// Runs argv[0] (a path) with `argv`, the current environment plus `env`
// ("NAME=value" entries, overriding; a bare "NAME" removes NAME, for a test
// of what happens where it is unset), in its own process group.
ProcessResult run_process(const std::vector<std::string>& argv,
                          std::chrono::milliseconds limit = std::chrono::seconds(120),
                          const std::vector<std::string>& env = {});

// Runs argv as run_process does, waits until `file` exists (a checkpoint:
// files appear only complete), or a later one of its directory (one that
// sorts after it: a run that keeps its last few may have deleted `file`
// already), then SIGKILLs the program and its children (a launcher and its
// ranks): the run dies somewhere after that point. The result is the
// shell's: exit 0, and the program's output so far.
ProcessResult run_until_file_then_kill(const std::vector<std::string>& argv,
                                       const std::string& file,
                                       std::chrono::milliseconds limit = std::chrono::seconds(300));

// Runs a launcher as run_process does, waits until `file` (or a later one) exists, then
// SIGKILLs one of its ranks: the oldest child of the launcher named `rank`
// (its reaper is a child too, under another name). The launcher lives on;
// the result ends with a line "launcher exit N", its exit status.
ProcessResult run_until_file_then_kill_rank(const std::vector<std::string>& argv,
                                            const std::string& file, const std::string& rank,
                                            std::chrono::milliseconds limit = std::chrono::seconds(300));

// Path of an executable built into build/bin/ (lockstep-run, test workers).
std::string bin_path(const std::string& name);

// A loopback TCP port nothing listens on (bound once, then released): an
// address that refuses connections.
int unused_tcp_port();

// A loopback port P such that P and P + 1 are both free, drawn below the
// kernel's ephemeral range (which client sockets take their ports from), for
// a launcher that listens on P + 1 too (torchrun's store, then lockstep's).
int unused_tcp_port_pair();

// Whether a script that skips by printing "SKIPPED: <reason>" and exiting 0
// did so; if it did, prints that line (ctest's SKIP_REGULAR_EXPRESSION then
// reports the test as skipped).
bool script_skipped(const ProcessResult& result);

// "exit 0", "exit 3", "signal SIGKILL", "timed out after 12.0 s", for messages.
std::string describe(const ProcessResult& result);

}  // namespace lockstep::testing
