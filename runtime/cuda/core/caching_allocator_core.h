// CachingAllocatorCore: the bookkeeping of the CUDA caching allocator, free of
// CUDA so that it is tested on any machine (tests/runtime/cuda/).
//
// Like PyTorch's CUDACachingAllocator, in a simpler form:
//
//   size classes  a request is rounded up to a multiple of 512 B when it is at
//                 most 1 MiB ("small"), else to a multiple of 2 MiB ("large");
//                 0 B counts as 512 B.
//   segments      memory comes from the backend in segments: 2 MiB for small
//                 requests (many blocks share one), exactly the rounded size for
//                 large ones. A segment belongs to one (device, stream).
//   blocks        a segment is cut into blocks. An allocation takes the
//                 smallest free block of its class on the same device and stream
//                 that fits (best fit), splitting off the rest when that is at
//                 least 512 B (small) or more than 1 MiB (large). A freed block
//                 merges with free neighbours in its segment.
//   streams       memory is only reused on the stream it was allocated on, so
//                 work queued on that stream is ordered after earlier users.
//                 When other streams used a block too, record_stream() names
//                 them; free() then records an event on each, and the block
//                 becomes reusable only once all those events have completed
//                 (checked, without blocking, at each allocate and
//                 empty_cache).
//   out of memory when the backend is out of memory, the device's freed blocks
//                 still waiting for other streams are waited for (the host
//                 blocks), its cached free segments are returned and the
//                 allocation is retried once; failing again throws
//                 OutOfMemoryError with the statistics. So does a request
//                 beyond kMaxRequest, at once.
//
// Thread-safe: one mutex guards everything, backend calls included.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "lockstep/runtime/cuda/core/allocator_backend.h"
#include "lockstep/runtime/error.h"

namespace lockstep::runtime::cuda {

inline constexpr std::size_t kMinBlockSize = 512;              // small requests round to this
inline constexpr std::size_t kSmallSize = std::size_t{1} << 20;  // largest "small" request
inline constexpr std::size_t kSmallSegment = std::size_t{2} << 20;  // segment for small blocks
inline constexpr std::size_t kLargeRound = std::size_t{2} << 20;    // large requests round to this
inline constexpr std::size_t kMaxRequest = std::size_t{1} << 60;    // larger: surely a bad size

// The size a request of `bytes` occupies (see the size classes above).
std::size_t round_allocation_size(std::size_t bytes);

// Statistics of one device. Exact, updated under the allocator's lock.
struct AllocatorStats {
  std::size_t allocated_bytes = 0;       // in blocks handed out and not yet freed (rounded)
  std::size_t reserved_bytes = 0;        // in segments held from the backend
  std::size_t peak_allocated_bytes = 0;  // highest allocated_bytes since reset_peak
  std::size_t peak_reserved_bytes = 0;   // highest reserved_bytes since reset_peak
  std::size_t requested_bytes = 0;       // as asked for, for blocks handed out
  std::uint64_t allocations = 0;         // allocate() calls that succeeded
  std::uint64_t cache_hits = 0;          // ... served from a cached block
  std::uint64_t backend_allocs = 0;      // segments obtained (cudaMalloc calls)
  std::uint64_t backend_frees = 0;       // segments returned (cudaFree calls)
  std::uint64_t oom_retries = 0;         // times the cache was emptied to retry after OOM
  std::size_t pending_blocks = 0;        // freed, waiting for other streams' events
  std::size_t active_blocks = 0;         // handed out and not yet freed
};

// Thrown when a request cannot be met even after emptying the cache.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

class CachingAllocatorCore {
 public:
  // `name` prefixes messages ("CUDA"). The backend must outlive the allocator.
  explicit CachingAllocatorCore(AllocatorBackend& backend, std::string name = "CUDA");
  // Returns every segment to the backend: pointers still allocated become
  // invalid. Events still pending are destroyed.
  ~CachingAllocatorCore();
  CachingAllocatorCore(const CachingAllocatorCore&) = delete;
  CachingAllocatorCore& operator=(const CachingAllocatorCore&) = delete;

  // A block of at least `bytes` on `device`, to be used on `stream`. Throws
  // OutOfMemoryError (see above) or the backend's error.
  void* allocate(int device, std::size_t bytes, StreamKey stream);

  // Gives the block back to the cache of its (device, stream). Throws
  // lockstep::Error for a pointer not from allocate() (or not the start of a
  // block) and for a block already freed; when recording an event for a
  // stream that used it fails, throws that error and keeps the block
  // allocated (never reused).
  void free(void* ptr);

  // Declares that `stream` uses the block at `ptr` too: when the block is freed
  // it is not reused before the work queued on `stream` until then is done.
  // A no-op for the block's own stream.
  void record_stream(void* ptr, StreamKey stream);

  // Returns every cached segment with no block in use (or waiting on events)
  // to the backend, on `device`, or on all devices when device < 0.
  void empty_cache(int device = -1);

  AllocatorStats stats(int device) const;
  // Sets the peaks to the current values.
  void reset_peak_stats(int device);

  // The size of the block at `ptr` (rounded); throws like free() for a pointer
  // that is not allocated.
  std::size_t block_size(const void* ptr) const;
  // The device of the block at `ptr`; throws like block_size().
  int block_device(const void* ptr) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep::runtime::cuda
