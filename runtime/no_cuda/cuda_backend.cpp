// A build without CUDA: no CUDA backend, so device_backend() answers with the
// base class, whose kernels say so (device_backend.h). CMake builds this file
// or runtime/cuda/cuda_backend.cpp, never both.
#include "lockstep/runtime/device_backend.h"

namespace lockstep::runtime {

const DeviceBackend* registered_cuda_backend() { return nullptr; }

}  // namespace lockstep::runtime
