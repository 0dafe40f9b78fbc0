// The event half of an AllocatorBackend over CUDA events, shared by the
// device allocator (caching_allocator.cpp) and the pinned host pool
// (pinned.cpp): events without timing, polled without blocking.
#pragma once

#include <cuda_runtime_api.h>

#include "lockstep/runtime/cuda/core/allocator_backend.h"

namespace lockstep::runtime::cuda {

class CudaEventBackend : public AllocatorBackend {
 public:
  bool event_completed(EventKey event) override;
  void wait_event(EventKey event) override;
  void destroy_event(EventKey event) override;

 protected:
  // A new event on `device`, recorded on `stream`.
  static EventKey record_on(int device, cudaStream_t stream);
};

}  // namespace lockstep::runtime::cuda
