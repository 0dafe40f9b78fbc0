#include "lockstep/runtime/cuda/pinned.h"

#include <iostream>
#include <optional>

#include <cuda_runtime_api.h>

#include "lockstep/runtime/cuda/cuda_event_backend.h"
#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/device_guard.h"

namespace lockstep::runtime::cuda {
namespace {

// Pinned blocks all live in one pool: "device" 0 and a stream key that no CUDA
// stream equals, so that every stream a buffer is used on, the legacy default
// stream included, is recorded and waited for before reuse.
constexpr int kPoolDevice = 0;
const char kPoolStreamTag = 0;
StreamKey pool_stream() { return const_cast<char*>(&kPoolStreamTag); }

// cudaHostAlloc / cudaFreeHost; events go on the stream's own device, which the
// backend learns from the stream (the current device for the legacy stream).
class PinnedBackend final : public CudaEventBackend {
 public:
  void* allocate(int, std::size_t bytes) override {
    void* ptr = nullptr;
    // Portable: usable with every device, not only the current one.
    const cudaError_t error = cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable);
    if (error == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return nullptr;
    }
    if (error != cudaSuccess) {
      runtime::detail::throw_cuda_error(error, "cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable)",
                                        __FILE__, __LINE__);
    }
    return ptr;
  }

  void deallocate(int, void* ptr) override { LOCKSTEP_CUDA_CHECK(cudaFreeHost(ptr)); }

  EventKey record_event(int, StreamKey key) override {
    const auto stream = static_cast<cudaStream_t>(key);
    int device = 0;
    if (stream == nullptr) {
      device = current_device();
    } else {
      LOCKSTEP_CUDA_CHECK(cudaStreamGetDevice(stream, &device));
    }
    return record_on(device, stream);
  }

  std::string describe_memory(int) override {
    return "pinned memory is page-locked host memory, limited by RAM and the memlock limit "
           "(ulimit -l)";
  }
};

CachingAllocatorCore& pinned_allocator() {
  static auto* backend = new PinnedBackend;
  static auto* allocator = new CachingAllocatorCore(*backend, "pinned host memory");
  return *allocator;
}

}  // namespace

PinnedBuffer::PinnedBuffer(std::size_t bytes)
    : data_(pinned_allocator().allocate(kPoolDevice, bytes, pool_stream())), size_(bytes) {}

void PinnedBuffer::record_stream(StreamView stream) {
  LOCKSTEP_CHECK(data_ != nullptr, "PinnedBuffer::record_stream on an empty buffer");
  if (stream.handle == nullptr) {
    // The legacy stream's key (null) does not say whose it is: the buffer does.
    LOCKSTEP_CHECK(legacy_device_ < 0 || legacy_device_ == stream.device,
                   "a pinned buffer used on the legacy default streams of devices {} and {}; "
                   "use one buffer per device, or non-default streams",
                   legacy_device_, stream.device);
    legacy_device_ = stream.device;
  }
  pinned_allocator().record_stream(data_, stream.handle);
}

void PinnedBuffer::reset() noexcept {
  if (data_ == nullptr) return;
  try {
    // An event for a legacy-stream use goes on the current device's (see
    // PinnedBackend::record_event): make that the device it was used on.
    std::optional<DeviceGuard> guard;
    if (legacy_device_ >= 0) guard.emplace(std::exchange(legacy_device_, -1));
    pinned_allocator().free(std::exchange(data_, nullptr));
  } catch (const std::exception& e) {
    std::cerr << "lockstep: warning: freeing a pinned buffer failed: " << e.what() << std::endl;
  }
}

void pinned_empty_cache() { pinned_allocator().empty_cache(); }

AllocatorStats pinned_stats() { return pinned_allocator().stats(kPoolDevice); }

void copy_to_device_async(void* device_dst, const void* host_src, std::size_t bytes,
                          StreamView stream) {
  DeviceGuard guard(stream.device);
  LOCKSTEP_CUDA_CHECK(
      cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, stream.handle));
}

void copy_to_host_async(void* host_dst, const void* device_src, std::size_t bytes,
                        StreamView stream) {
  DeviceGuard guard(stream.device);
  LOCKSTEP_CUDA_CHECK(
      cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, stream.handle));
}

void copy_to_device_async(void* device_dst, PinnedBuffer& host_src, std::size_t bytes,
                          StreamView stream) {
  LOCKSTEP_CHECK(bytes <= host_src.size(),
                 "copy_to_device_async: {} bytes from a pinned buffer of {} bytes", bytes,
                 host_src.size());
  copy_to_device_async(device_dst, host_src.data(), bytes, stream);
  host_src.record_stream(stream);
}

void copy_to_host_async(PinnedBuffer& host_dst, const void* device_src, std::size_t bytes,
                        StreamView stream) {
  LOCKSTEP_CHECK(bytes <= host_dst.size(),
                 "copy_to_host_async: {} bytes into a pinned buffer of {} bytes", bytes,
                 host_dst.size());
  copy_to_host_async(host_dst.data(), device_src, bytes, stream);
  host_dst.record_stream(stream);
}

}  // namespace lockstep::runtime::cuda
