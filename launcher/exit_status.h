// How a child ended, in words and as the launcher's exit code.
#pragma once

#include <string>

namespace lockstep::launcher {

// "SIGKILL", or "signal 42" for one without a name.
std::string signal_name(int signal);

// From a waitpid status: "exited with code 3", "was killed by SIGKILL (core dumped)".
std::string describe_wait_status(int status);

// True unless the child exited with code 0.
bool failed(int status);

// The launcher's exit code for a failed child: its code, or 128 + signal.
int exit_code_of(int status);

}  // namespace lockstep::launcher
