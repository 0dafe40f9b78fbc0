#include "lockstep/runtime/cuda_available.h"

#include "lockstep/runtime/device_backend.h"

namespace lockstep::runtime {

bool cuda_available() { return probe_gpus().count > 0; }

GpuInventory probe_gpus() { return device_backend(Device::cuda(0)).probe(); }

void set_current_gpu(int index) { device_backend(Device::cuda(index)).set_current(index); }

}  // namespace lockstep::runtime
