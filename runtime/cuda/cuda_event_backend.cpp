#include "lockstep/runtime/cuda/cuda_event_backend.h"

#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/device_guard.h"

namespace lockstep::runtime::cuda {

EventKey CudaEventBackend::record_on(int device, cudaStream_t stream) {
  DeviceGuard guard(device);
  cudaEvent_t event = nullptr;
  LOCKSTEP_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  if (const cudaError_t error = cudaEventRecord(event, stream); error != cudaSuccess) {
    cudaEventDestroy(event);  // not leaked with the error
    runtime::detail::throw_cuda_error(error, "cudaEventRecord(event, stream)", __FILE__, __LINE__);
  }
  return event;
}

void CudaEventBackend::wait_event(EventKey event) {
  LOCKSTEP_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}

bool CudaEventBackend::event_completed(EventKey event) {
  const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (status == cudaErrorNotReady) {
    cudaGetLastError();  // "not ready" is an answer, not an error to keep
    return false;
  }
  LOCKSTEP_CUDA_CHECK(status);
  return true;
}

void CudaEventBackend::destroy_event(EventKey event) {
  LOCKSTEP_CUDA_CHECK(cudaEventDestroy(static_cast<cudaEvent_t>(event)));
}

}  // namespace lockstep::runtime::cuda
