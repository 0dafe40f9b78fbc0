#include "lockstep/runtime/cuda/ops/fused_optimizer.h"

#include <atomic>
#include <climits>
#include <cstring>

#include "lockstep/runtime/cuda/caching_allocator.h"
#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/device_guard.h"
#include "lockstep/runtime/cuda/pinned.h"
#include "lockstep/runtime/cuda/stream.h"

namespace lockstep::runtime::cuda {

namespace {

std::atomic<int64_t> launches{0};

cudaError_t launch_kernel(const kernels::SgdTensor* t, int n, int64_t total, cudaStream_t s) {
  return kernels::sgd_step(t, n, total, s);
}
cudaError_t launch_kernel(const kernels::AdamTensor* t, int n, int64_t total, cudaStream_t s) {
  return kernels::adam_step(t, n, total, s);
}

}  // namespace

template <class Entry>
void FusedLaunch<Entry>::add(const Tensor& param, const Tensor& grad, Entry entry) {
  const int device = param.device().index;
  OnDevice* on = nullptr;
  for (OnDevice& d : devices_)
    if (d.device == device) on = &d;
  if (on == nullptr) on = &devices_.emplace_back(OnDevice{.device = device});
  on->total += param.numel();
  entry.end = on->total;
  on->entries.push_back(entry);
  keep_.push_back(grad);
}

template <class Entry>
void FusedLaunch<Entry>::launch() {
  for (const OnDevice& d : devices_) {
    if (d.total == 0) continue;  // only empty tensors
    LOCKSTEP_CHECK(d.entries.size() <= INT_MAX, "fused optimizer step: {} tensors on one device "
                   "is more than one launch takes", d.entries.size());
    DeviceGuard guard(d.device);
    const StreamView stream = current_stream(d.device);
    // Pinned staging, then a device copy on the launch's stream: both are
    // reused only after the kernel has run (record_stream / stream order).
    const std::size_t bytes = d.entries.size() * sizeof(Entry);
    PinnedBuffer host(bytes);
    std::memcpy(host.data(), d.entries.data(), bytes);
    DeviceBuffer table(bytes, stream);
    copy_to_device_async(table.data(), host, bytes, stream);
    LOCKSTEP_CUDA_CHECK(launch_kernel(static_cast<const Entry*>(table.data()),
                                      static_cast<int>(d.entries.size()), d.total, stream.handle));
    launches.fetch_add(1, std::memory_order_relaxed);
  }
  devices_.clear();
  keep_.clear();  // freed in stream order: the kernel reads them first
}

template class FusedLaunch<kernels::SgdTensor>;
template class FusedLaunch<kernels::AdamTensor>;

int64_t fused_optimizer_launches() { return launches.load(std::memory_order_relaxed); }

}  // namespace lockstep::runtime::cuda
