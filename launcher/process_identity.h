// A process told apart from a later one that reuses its pid: the pid and
// when the process started (field 22 of /proc/<pid>/stat, in clock ticks
// since boot).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>

namespace lockstep::launcher {

// When `pid` started; nullopt when there is no such process.
std::optional<uint64_t> process_start_time(pid_t pid);

// Whether the process that was `pid` and started at `start_time` still runs.
bool process_alive(pid_t pid, uint64_t start_time);

// Whether `pid` is stopped (SIGSTOP, SIGTSTP, or a debugger's trace stop).
bool process_stopped(pid_t pid);

// Whether process group `pgid` holds a process that is not a zombie: one
// that is dead but not yet waited for by its parent (outside the group) can
// neither be killed nor hold anything open.
bool group_has_living(pid_t pgid);

}  // namespace lockstep::launcher
