// Skipping GPU tests where there is no GPU.
//
// Every test tagged [gpu] begins with LOCKSTEP_SKIP_UNLESS_GPU() (or
// LOCKSTEP_SKIP_UNLESS_GPUS(n)). Where lockstep was built without CUDA or no
// (or too few) CUDA devices are found, it prints one line
//   SKIPPED: <reason>
// and returns from the test case. tests/CMakeLists.txt registers the [gpu]
// tests with the ctest label `gpu` and SKIP_REGULAR_EXPRESSION "SKIPPED:", so
// ctest reports them as skipped, neither passed nor failed.
#pragma once

#include <string>

#include <fmt/format.h>

#include "lockstep/config.h"
#include "support/skip.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/runtime/cuda/device.h"
#endif

namespace lockstep::testing {

// Empty when at least `min_devices` CUDA devices can be used; otherwise why not.
inline std::string gpu_skip_reason(int min_devices = 1) {
#if LOCKSTEP_HAVE_CUDA
  const int count = runtime::cuda_device_count();
  if (count >= min_devices) return {};
  if (count == 0) return runtime::cuda_unavailable_reason();
  return fmt::format("needs {} CUDA devices, found {}", min_devices, count);
#else
  (void)min_devices;
  return "lockstep built without CUDA (configure with -DLOCKSTEP_CUDA=ON)";
#endif
}

}  // namespace lockstep::testing

#define LOCKSTEP_SKIP_UNLESS_GPUS(min_devices) \
  LOCKSTEP_SKIP_IF(::lockstep::testing::gpu_skip_reason(min_devices))

#define LOCKSTEP_SKIP_UNLESS_GPU() LOCKSTEP_SKIP_UNLESS_GPUS(1)
