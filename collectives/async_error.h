// What a process does when a collective fails where no caller is waiting for
// it: the NCCL watchdog finding a timeout or an asynchronous NCCL error
// (nccl/nccl_watchdog.h). PyTorch's TORCH_NCCL_ASYNC_ERROR_HANDLING, in two
// settings:
//   end-process (default)  after failing the Works and aborting the
//       communicator, write one report to stderr (the op, this rank, the
//       group, the reason) and end the process with exit code 1 at once: the
//       launcher stops the job and names the rank, and no stream that was
//       released by the abort can feed a partly reduced bucket to the
//       optimizer.
//   fail-works  fail the Works and mark the group unusable, and go on: for
//       callers that catch the error and recover by themselves (a new group).
// LOCKSTEP_ASYNC_ERROR_HANDLING sets it for the process (distributed/launch_env.h);
// NcclOptions::async_errors for one group.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "lockstep/distributed/launch_env.h"

namespace lockstep::collectives {

enum class AsyncErrorHandling { end_process, fail_works };

// "end-process" or "fail-works"; throws naming `what` (the variable) otherwise.
AsyncErrorHandling parse_async_error_handling(const std::string& text, const std::string& what);

// LOCKSTEP_ASYNC_ERROR_HANDLING, else end-process.
AsyncErrorHandling async_error_handling_from_env(const runtime::EnvLookup& env = runtime::process_env());

struct AsyncFailure {
  std::string where;   // "rank 1 of group 'default' (nccl, 4 ranks)"
  std::string reason;  // the op and why: "allreduce(f32, 1024 elements, sum) timed out ..."
};

// The line end-process writes.
std::string async_failure_report(const AsyncFailure& failure);

// How the report leaves and the process ends; tests inject both.
struct ProcessEnding {
  std::function<void(const std::string& report)> write;  // default: stderr, flushed
  std::function<void(int exit_code)> end;                // default: std::_Exit
};

// Under end_process writes the report and ends the process (exit code 1;
// with injected hooks, returns after calling them). Under fail_works does
// nothing: the Works carry the error.
void on_async_failure(AsyncErrorHandling handling, const AsyncFailure& failure,
                      const ProcessEnding& ending = {});

}  // namespace lockstep::collectives
