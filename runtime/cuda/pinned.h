// Pinned (page-locked) host buffers and asynchronous host <-> device copies.
//
// Pinned buffers come from a cache: the same CachingAllocatorCore as device
// memory (cuda/core/caching_allocator_core.h: 512 B classes in 2 MiB pinned
// segments up to 1 MiB, 2 MiB classes above) over cudaHostAlloc/cudaFreeHost.
// A buffer given back is reused only after the work queued so far on every
// stream that used it (record_stream(); the copy helpers below record it) is
// done, so an asynchronous copy never reads or writes a buffer already handed
// to someone else. Only pinned memory makes cudaMemcpyAsync truly asynchronous.
#pragma once

#include <cstddef>
#include <utility>

#include "lockstep/runtime/cuda/core/caching_allocator_core.h"
#include "lockstep/runtime/cuda/stream.h"

namespace lockstep::runtime::cuda {

// A pinned host buffer from the cache. Move-only; the destructor gives it back.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t bytes);  // throws OutOfMemoryError, lockstep::Error
  ~PinnedBuffer() { reset(); }
  PinnedBuffer(PinnedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(other.size_),
        legacy_device_(std::exchange(other.legacy_device_, -1)) {}
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = other.size_;
      legacy_device_ = std::exchange(other.legacy_device_, -1);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return data_; }
  std::size_t size() const { return size_; }
  // `stream` uses this buffer: when the buffer is given back, an event is
  // recorded on `stream` and the buffer is not reused before it completes.
  // For the legacy default stream ({nullptr, d}) the buffer remembers d and
  // records on d's when given back; a buffer is used on the legacy stream of
  // one device at most (throws naming both otherwise).
  void record_stream(StreamView stream);
  void reset() noexcept;

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
  int legacy_device_ = -1;  // the device whose legacy stream used it, if any
};

// Returns cached pinned memory that no buffer uses to CUDA.
void pinned_empty_cache();
// Statistics of the pinned cache (reported as device 0 of its allocator).
AllocatorStats pinned_stats();

// Queues a copy of `bytes` on `stream`; the host returns at once. `host` should
// be pinned for the copy to be asynchronous, and must stay valid until the
// copy is done (synchronize the stream or an event recorded after it).
void copy_to_device_async(void* device_dst, const void* host_src, std::size_t bytes,
                          StreamView stream);
void copy_to_host_async(void* host_dst, const void* device_src, std::size_t bytes,
                        StreamView stream);
// The same from / into a pinned buffer (bytes <= its size), which records the
// stream on it, so the buffer may be released before the copy is done.
void copy_to_device_async(void* device_dst, PinnedBuffer& host_src, std::size_t bytes,
                          StreamView stream);
void copy_to_host_async(PinnedBuffer& host_dst, const void* device_src, std::size_t bytes,
                        StreamView stream);

}  // namespace lockstep::runtime::cuda
