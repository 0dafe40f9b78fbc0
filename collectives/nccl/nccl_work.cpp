#include "lockstep/collectives/nccl/nccl_work.h"

#include <thread>

#include <fmt/format.h>

namespace lockstep::collectives::detail {

NcclWork::NcclWork(std::string description, Clock::time_point deadline,
                   std::string timeout_message, int device, bool host_wait,
                   std::shared_ptr<AbortState> abort)
    : Work(std::move(description), deadline, timeout_message),
      deadline_(deadline),
      timeout_message_(std::move(timeout_message)),
      device_(device),
      host_wait_(host_wait),
      abort_(std::move(abort)) {}

bool NcclWork::poll() {
  if (Work::is_completed()) return true;
  if (!armed_.load(std::memory_order_acquire) || !end_.query()) return false;
  // The watchdog fails the Works it knows of before it aborts the
  // communicator; one still on its way to it when the group is marked
  // unusable is failed here, as its end event may have completed only because
  // the abort cut its kernel short.
  const std::string reason = abort_ != nullptr ? abort_->reason() : std::string();
  if (reason.empty()) {
    finish();
  } else {
    finish(std::make_exception_ptr(CollectiveError(fmt::format(
        "{} was aborted: the group became unusable because {}", description(), reason))));
  }
  return true;
}

bool NcclWork::is_completed() { return poll(); }

void NcclWork::wait_until_done() {
  if (host_wait_) {
    // Ends: the watchdog fails the Work at its deadline at the latest.
    while (!poll()) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  if (const auto error = exception()) std::rethrow_exception(error);
  if (!host_wait_) end_.wait(runtime::cuda::current_stream(device_));
}

}  // namespace lockstep::collectives::detail
