// StreamGate: holds a CUDA stream until release(), so a test can tell what
// waits for that stream (a host function queued on it spins on a flag).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <thread>

#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/stream.h"

namespace lockstep::testing {

class StreamGate {
 public:
  explicit StreamGate(runtime::cuda::StreamView stream) {
    LOCKSTEP_CUDA_CHECK(cudaLaunchHostFunc(stream.handle, &StreamGate::hold, &open_));
  }
  ~StreamGate() { release(); }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;
  void release() { open_.store(true); }

 private:
  static void hold(void* flag) {
    while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::yield();
  }
  std::atomic<bool> open_{false};
};

}  // namespace lockstep::testing
