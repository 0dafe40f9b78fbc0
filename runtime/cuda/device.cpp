#include "lockstep/runtime/cuda/device.h"

#include <cstdio>

#include <fmt/format.h>

#include "lockstep/runtime/cuda/core/error_context.h"

namespace lockstep::runtime {
namespace {

// Errors from cudaGetDeviceCount that mean "no usable GPU on this machine"
// rather than a bug: no device, no or too old a driver, only the stub libcuda,
// devices busy or not ready.
bool means_no_device(cudaError_t error) {
  switch (error) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemNotReady:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return true;
    default:
      return false;
  }
}

struct DeviceProbe {
  int count = 0;
  cudaError_t error = cudaSuccess;
};

DeviceProbe probe_devices() {
  DeviceProbe probe;
  probe.error = cudaGetDeviceCount(&probe.count);
  if (probe.error != cudaSuccess) {
    cudaGetLastError();  // do not leave the error behind for the next check
    probe.count = 0;
  }
  return probe;
}

}  // namespace

int cuda_device_count() {
  const DeviceProbe probe = probe_devices();
  if (probe.error != cudaSuccess && !means_no_device(probe.error)) {
    detail::throw_cuda_error(probe.error, "cudaGetDeviceCount(&count)", __FILE__, __LINE__);
  }
  return probe.count;
}

std::string cuda_unavailable_reason() {
  const DeviceProbe probe = probe_devices();
  if (probe.count > 0) return {};
  if (probe.error == cudaSuccess) return "no CUDA device found";
  return fmt::format("no CUDA device found ({})", cudaGetErrorString(probe.error));
}

namespace detail {

void throw_cuda_error(cudaError_t error, const char* expr, const char* file, int line) {
  cudaGetLastError();  // clear a non-sticky error so later checks see their own
  throw Error(cuda::library_error_message(
      "CUDA", expr, file, line,
      fmt::format("{} ({})", cudaGetErrorString(error), cudaGetErrorName(error))));
}

void warn_cuda_error(cudaError_t error, const char* expr) noexcept {
  cudaGetLastError();
  std::fprintf(stderr, "lockstep: warning: %s failed on %s: %s (%s)\n", expr,
               cuda::process_rank_text().c_str(), cudaGetErrorString(error),
               cudaGetErrorName(error));
}

}  // namespace detail
}  // namespace lockstep::runtime
