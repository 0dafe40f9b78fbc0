#include "lockstep/runtime/cuda_available.h"

#include "lockstep/config.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/runtime/cuda/device.h"
#endif

namespace lockstep::runtime {

bool cuda_available() {
#if LOCKSTEP_HAVE_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

}  // namespace lockstep::runtime
