// This process's id without a system call each time: checked on every
// collective (a child forked from the process that made a group cannot use
// it), where getpid() would cost a system call per call.
#pragma once

#include <sys/types.h>

namespace lockstep::runtime {

// getpid(), cached; a forked child's is set anew before fork() returns in it.
pid_t this_process_id();

}  // namespace lockstep::runtime
