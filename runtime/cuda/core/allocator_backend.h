// What the caching allocator needs from a device: raw allocations and events.
// CUDA-free: the CUDA implementation lives in cuda/caching_allocator.cpp; the
// tests use a fake one (host memory, events completed by hand).
#pragma once

#include <cstddef>
#include <string>

namespace lockstep::runtime::cuda {

// A stream as the allocator sees it: an opaque key (a cudaStream_t for the CUDA
// backend; nullptr is the legacy default stream).
using StreamKey = void*;
// An event created by the backend (a cudaEvent_t for CUDA).
using EventKey = void*;

class AllocatorBackend {
 public:
  virtual ~AllocatorBackend() = default;

  // `bytes` of device memory on `device`, or nullptr when the device is out of
  // memory (the allocator then frees its cache and retries). Other failures
  // throw lockstep::Error.
  virtual void* allocate(int device, std::size_t bytes) = 0;
  // Returns memory from allocate(). Throws lockstep::Error on failure.
  virtual void deallocate(int device, void* ptr) = 0;

  // An event on `device`, recorded on `stream` (a stream of that device): it
  // completes when the work queued on `stream` so far has finished.
  virtual EventKey record_event(int device, StreamKey stream) = 0;
  // True once the event has completed; never blocks.
  virtual bool event_completed(EventKey event) = 0;
  // Blocks until the event has completed (only when out of memory).
  virtual void wait_event(EventKey event) = 0;
  virtual void destroy_event(EventKey event) = 0;

  // One line on the device's memory for out-of-memory messages (e.g. "the GPU
  // has 1.20 GiB free of 79.1 GiB"); empty when unknown.
  virtual std::string describe_memory(int /*device*/) { return {}; }
};

}  // namespace lockstep::runtime::cuda
