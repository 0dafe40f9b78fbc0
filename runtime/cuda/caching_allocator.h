// The process-wide CUDA caching allocator: CachingAllocatorCore
// (cuda/core/caching_allocator_core.h, where the caching scheme is described)
// over cudaMalloc, cudaFree and CUDA events.
//
// Memory is cached per (device, stream): allocate on the stream that will use
// the memory; when another stream uses it too, call record_stream() before
// freeing, so that the block is not handed out again while that stream may
// still read or write it.
#pragma once

#include <cstddef>
#include <utility>

#include "lockstep/runtime/cuda/core/caching_allocator_core.h"
#include "lockstep/runtime/cuda/stream.h"

namespace lockstep::runtime::cuda {

// The allocator itself. Never destroyed (the CUDA context may be gone when
// static destructors run); its cached memory goes with the process.
CachingAllocatorCore& caching_allocator();

// `bytes` on the stream's device for use on `stream` (default: the current
// stream of the current device). Throws OutOfMemoryError or lockstep::Error.
void* device_alloc(std::size_t bytes, StreamView stream);
void* device_alloc(std::size_t bytes);
// Returns memory from device_alloc to the cache. Work queued on the block's
// stream before this call may still use it: the block is reused only by later
// work on that stream.
void device_free(void* ptr);
// `stream` (of the block's device) uses the block too; see above.
void record_stream(void* ptr, StreamView stream);
// Tests: while on, every block device_alloc hands out is first filled, whole,
// with 0xFF bytes (NaN in every floating dtype), so an element a kernel forgot
// to write, or read past its request, shows up. Off by default.
void set_poison_allocations(bool on);
bool poison_allocations();
// Returns cached memory no block in use needs to CUDA (all devices).
void empty_cache();
AllocatorStats memory_stats(int device);
// Sets `device`'s peaks to what is in use now.
void reset_peak_memory_stats(int device);

// Owns one block from the caching allocator. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(std::size_t bytes, StreamView stream)
      : data_(device_alloc(bytes, stream)), size_(bytes), stream_(stream) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(other.size_), stream_(other.stream_) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = other.size_;
      stream_ = other.stream_;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  std::size_t size() const { return size_; }
  StreamView stream() const { return stream_; }
  void record_stream(StreamView stream) { cuda::record_stream(data_, stream); }
  void reset() noexcept;

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
  StreamView stream_;
};

}  // namespace lockstep::runtime::cuda
