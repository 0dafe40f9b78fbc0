// DeviceGuard: makes a CUDA device current for a scope.
#pragma once

#include <cuda_runtime_api.h>

#include "lockstep/runtime/cuda/device.h"

namespace lockstep::runtime::cuda {

// Sets the calling thread's current device to `device` and restores the
// previous one when the scope ends. Calls cudaSetDevice only when the device
// changes. Throws lockstep::Error when either device cannot be read or set;
// the destructor logs instead of throwing.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    LOCKSTEP_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device != previous_) LOCKSTEP_CUDA_CHECK(cudaSetDevice(device));
    current_ = device;
  }
  ~DeviceGuard() {
    if (current_ == previous_) return;
    if (const cudaError_t error = cudaSetDevice(previous_); error != cudaSuccess) {
      runtime::detail::warn_cuda_error(error, "cudaSetDevice(previous) in ~DeviceGuard");
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  int previous_device() const { return previous_; }
  int device() const { return current_; }

 private:
  int previous_ = 0;
  int current_ = 0;
};

// The calling thread's current CUDA device (cudaGetDevice).
inline int current_device() {
  int device = 0;
  LOCKSTEP_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

}  // namespace lockstep::runtime::cuda
