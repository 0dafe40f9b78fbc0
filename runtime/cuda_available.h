// Whether this process can use CUDA, and which GPUs it sees. Builds with and
// without LOCKSTEP_CUDA.
#pragma once

#include <string>

namespace lockstep::runtime {

// False when lockstep was built without CUDA (LOCKSTEP_CUDA off) or no CUDA
// device is usable here; otherwise true. Throws lockstep::Error only for an
// unexpected CUDA failure, never for a missing GPU or driver.
bool cuda_available();

struct GpuInventory {
  bool cuda_built = false;         // lockstep was built with CUDA
  int count = 0;                   // GPUs this process can use
  std::string unavailable_reason;  // count == 0 in a CUDA build: CUDA's reason
};

// Asks CUDA (in a CUDA build); throws as cuda_available() does.
GpuInventory probe_gpus();

// Makes GPU `index` the calling thread's current device (cudaSetDevice).
// Throws lockstep::Error with CUDA's reason, or where CUDA is not built in.
void set_current_gpu(int index);

}  // namespace lockstep::runtime
