#include "lockstep/collectives/nccl/nccl_host_staging.h"

#include <chrono>
#include <mutex>
#include <thread>
#include <utility>

namespace lockstep::collectives::detail {
namespace {

using runtime::Tensor;

// The collective's Work, plus the copies back to the host.
class HostResultWork final : public Work {
 public:
  HostResultWork(std::shared_ptr<Work> inner, std::vector<std::pair<Tensor, Tensor>> results)
      : Work(inner->description(), Clock::time_point::max(), ""),
        inner_(std::move(inner)),
        results_(std::move(results)) {}

  // The collective has finished; its results reach the host tensors in wait().
  bool is_completed() override {
    if (Work::is_completed()) return true;
    if (!inner_->is_completed()) return false;
    if (auto error = inner_->exception()) finish(error);
    return true;
  }

  void wait_until_done() override {
    std::lock_guard lock(wait_mutex_);
    if (!copied_back_) {
      copied_back_ = true;
      try {
        // On the host first: a CPU result promises a blocking wait, and only
        // the collective's own completion says whether it succeeded (one cut
        // short by an abort must not have its output copied as a result). The
        // watchdog ends it at its deadline at the latest.
        while (!inner_->is_completed()) std::this_thread::sleep_for(std::chrono::microseconds(20));
        inner_->wait();  // rethrows its error; orders this thread's current stream after it
        // Each copy to the host runs on that stream and returns once it is done.
        for (auto& [host, device] : results_) host.copy_(device.to(runtime::Device::cpu()));
        finish();
      } catch (...) {
        finish(std::current_exception());
      }
      results_.clear();
    }
    if (const auto error = exception()) std::rethrow_exception(error);
  }

 private:
  std::shared_ptr<Work> inner_;
  std::mutex wait_mutex_;
  bool copied_back_ = false;  // guarded by wait_mutex_
  std::vector<std::pair<Tensor, Tensor>> results_;  // (host tensor, its device copy)
};

}  // namespace

Tensor NcclHostStaging::stage(const Tensor& t, bool result) {
  if (!t.device().is_cpu()) return t;
  // On this thread's current stream: the collective, issued next, waits for it.
  Tensor copy = t.to(runtime::Device::cuda(device_));
  staged_.push_back({t, copy, result});
  return copy;
}

std::shared_ptr<Work> NcclHostStaging::wrap(std::shared_ptr<Work> inner) {
  if (staged_.empty()) return inner;
  std::vector<std::pair<Tensor, Tensor>> results;
  for (auto& s : staged_)
    if (s.result) results.emplace_back(s.host, s.device);
  staged_.clear();
  return std::make_shared<HostResultWork>(std::move(inner), std::move(results));
}

}  // namespace lockstep::collectives::detail
