#include "lockstep/runtime/cuda/caching_allocator.h"

#include <atomic>
#include <iostream>

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "lockstep/runtime/cuda/core/error_context.h"
#include "lockstep/runtime/cuda/cuda_event_backend.h"
#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/device_guard.h"

namespace lockstep::runtime::cuda {
namespace {

class CudaBackend final : public CudaEventBackend {
 public:
  void* allocate(int device, std::size_t bytes) override {
    DeviceGuard guard(device);
    void* ptr = nullptr;
    const cudaError_t error = cudaMalloc(&ptr, bytes);
    if (error == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return nullptr;
    }
    if (error != cudaSuccess) {
      runtime::detail::throw_cuda_error(error, "cudaMalloc(&ptr, bytes)", __FILE__, __LINE__);
    }
    return ptr;
  }

  void deallocate(int device, void* ptr) override {
    DeviceGuard guard(device);
    LOCKSTEP_CUDA_CHECK(cudaFree(ptr));
  }

  EventKey record_event(int device, StreamKey stream) override {
    return record_on(device, static_cast<cudaStream_t>(stream));
  }

  std::string describe_memory(int device) override {
    std::size_t free = 0;
    std::size_t total = 0;
    const cudaError_t error = [&] {
      DeviceGuard guard(device);
      return cudaMemGetInfo(&free, &total);
    }();
    if (error != cudaSuccess) {
      cudaGetLastError();
      return {};
    }
    return fmt::format("device {} has {} free of {} in all", device, format_bytes(free),
                       format_bytes(total));
  }
};

}  // namespace

CachingAllocatorCore& caching_allocator() {
  static auto* backend = new CudaBackend;
  static auto* allocator = new CachingAllocatorCore(*backend, "CUDA");
  return *allocator;
}

namespace {
std::atomic<bool> poison{false};
}

void set_poison_allocations(bool on) { poison.store(on); }
bool poison_allocations() { return poison.load(); }

void* device_alloc(std::size_t bytes, StreamView stream) {
  void* ptr = caching_allocator().allocate(stream.device, bytes, stream.handle);
  if (poison.load(std::memory_order_relaxed) && ptr != nullptr && bytes > 0) {
    // The whole block, not only the bytes asked for: a kernel reading past
    // its request then also finds NaN, not what the block held before.
    DeviceGuard guard(stream.device);
    LOCKSTEP_CUDA_CHECK(
        cudaMemsetAsync(ptr, 0xFF, caching_allocator().block_size(ptr), stream.handle));
  }
  return ptr;
}

void* device_alloc(std::size_t bytes) { return device_alloc(bytes, current_stream()); }

void device_free(void* ptr) { caching_allocator().free(ptr); }

void record_stream(void* ptr, StreamView stream) {
  // A stream handle means nothing on another device (the legacy stream's,
  // null, would even pass for the block's own).
  const int device = caching_allocator().block_device(ptr);
  LOCKSTEP_CHECK(stream.device == device,
                 "record_stream: a block of CUDA device {} used on a stream of device {}; copy the "
                 "tensor to that device instead",
                 device, stream.device);
  caching_allocator().record_stream(ptr, stream.handle);
}

void empty_cache() { caching_allocator().empty_cache(); }

AllocatorStats memory_stats(int device) { return caching_allocator().stats(device); }
void reset_peak_memory_stats(int device) { caching_allocator().reset_peak_stats(device); }

void DeviceBuffer::reset() noexcept {
  if (data_ == nullptr) return;
  try {
    device_free(std::exchange(data_, nullptr));
  } catch (const std::exception& e) {
    std::cerr << "lockstep: warning: freeing a CUDA buffer failed: " << e.what() << std::endl;
  }
}

}  // namespace lockstep::runtime::cuda
