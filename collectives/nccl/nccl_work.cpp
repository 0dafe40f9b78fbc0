#include "lockstep/collectives/nccl/nccl_work.h"

#include <thread>

namespace lockstep::collectives::detail {

NcclWork::NcclWork(std::string description, Clock::time_point deadline,
                   std::string timeout_message, int device, bool host_wait)
    : Work(std::move(description), deadline, timeout_message),
      deadline_(deadline),
      timeout_message_(std::move(timeout_message)),
      device_(device),
      host_wait_(host_wait) {}

bool NcclWork::poll() {
  if (Work::is_completed()) return true;
  if (!armed_.load(std::memory_order_acquire) || !end_.query()) return false;
  // The watchdog fails every Work before it aborts the communicator, so an end
  // event completed by an abort never reads as success here.
  finish();
  return true;
}

bool NcclWork::is_completed() { return poll(); }

void NcclWork::wait() {
  if (host_wait_) {
    // Ends: the watchdog fails the Work at its deadline at the latest.
    while (!poll()) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  if (const auto error = exception()) std::rethrow_exception(error);
  if (!host_wait_) end_.wait(runtime::cuda::current_stream(device_));
}

}  // namespace lockstep::collectives::detail
