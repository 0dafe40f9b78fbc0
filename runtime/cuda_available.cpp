#include "lockstep/runtime/cuda_available.h"

#include "lockstep/config.h"
#include "lockstep/runtime/error.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/runtime/cuda/device.h"
#endif

namespace lockstep::runtime {

bool cuda_available() { return probe_gpus().count > 0; }

GpuInventory probe_gpus() {
#if LOCKSTEP_HAVE_CUDA
  GpuInventory gpus{.cuda_built = true, .count = cuda_device_count()};
  if (gpus.count == 0) gpus.unavailable_reason = cuda_unavailable_reason();
  return gpus;
#else
  return {};
#endif
}

void set_current_gpu(int index) {
#if LOCKSTEP_HAVE_CUDA
  LOCKSTEP_CUDA_CHECK(cudaSetDevice(index));
#else
  throw Error(fmt::format("cannot use cuda:{}: this build of lockstep has no CUDA", index));
#endif
}

}  // namespace lockstep::runtime
