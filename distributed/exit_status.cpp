#include "lockstep/distributed/exit_status.h"

#include <string.h>
#include <sys/wait.h>

#include <fmt/format.h>

namespace lockstep::distributed {

std::string signal_name(int signal) {
  const char* abbrev = sigabbrev_np(signal);
  if (abbrev == nullptr) return fmt::format("signal {}", signal);
  return fmt::format("SIG{}", abbrev);
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return fmt::format("was killed by {}{}", signal_name(WTERMSIG(status)),
                       WCOREDUMP(status) ? " (core dumped)" : "");
  }
  return fmt::format("ended with wait status {:#x}", status);
}

bool ended_in_failure(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace lockstep::distributed
