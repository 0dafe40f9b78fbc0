// How a child process ended (its waitpid status), in words and as an exit
// code: for lockstep-run and collectives::spawn.
#pragma once

#include <string>

namespace lockstep::distributed {

// "SIGKILL", or "signal 42" for one without a name.
std::string signal_name(int signal);

// From a waitpid status: "exited with code 3", "was killed by SIGKILL (core dumped)".
std::string describe_wait_status(int status);

// True unless the child exited with code 0.
bool ended_in_failure(int status);

// The exit code a shell would report for the child: its code, or 128 + signal.
int exit_code_of(int status);

}  // namespace lockstep::distributed
