#include "lockstep/collectives/async_error.h"

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "lockstep/runtime/env.h"
#include "lockstep/runtime/error.h"

namespace lockstep::collectives {

AsyncErrorHandling parse_async_error_handling(const std::string& text, const std::string& what) {
  if (text == "end-process") return AsyncErrorHandling::end_process;
  if (text == "fail-works") return AsyncErrorHandling::fail_works;
  throw Error(fmt::format("{}={}: use end-process (the default: a failed collective ends the "
                          "process) or fail-works (the Works fail, the process goes on)",
                          what, runtime::quoted_value(text)));
}

AsyncErrorHandling async_error_handling_from_env(const runtime::EnvLookup& env) {
  const std::optional<std::string> text = distributed::read_async_error_handling(env);
  if (!text) return AsyncErrorHandling::end_process;
  return parse_async_error_handling(*text, "LOCKSTEP_ASYNC_ERROR_HANDLING");
}

std::string async_failure_report(const AsyncFailure& failure) {
  return fmt::format(
      "lockstep: {}: {}; this process ends now, its communicator with it, so that nothing "
      "goes on with a partly reduced result (LOCKSTEP_ASYNC_ERROR_HANDLING=fail-works keeps it "
      "running, with the group unusable)\n",
      failure.where, failure.reason);
}

void on_async_failure(AsyncErrorHandling handling, const AsyncFailure& failure,
                      const ProcessEnding& ending) {
  if (handling == AsyncErrorHandling::fail_works) return;
  const std::string report = async_failure_report(failure);
  if (ending.write) {
    ending.write(report);
  } else {
    std::fputs(report.c_str(), stderr);
    std::fflush(stderr);
  }
  // _Exit: no destructors, which could wait on the aborted communicator's
  // stream or on threads stuck in it.
  if (ending.end) ending.end(1);
  else std::_Exit(1);
}

}  // namespace lockstep::collectives
