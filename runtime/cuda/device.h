// CUDA device queries and LOCKSTEP_CUDA_CHECK, the one checking macro for CUDA
// runtime API calls. Compiled only when lockstep is built with LOCKSTEP_CUDA;
// code that must build either way uses lockstep/runtime/cuda_available.h.
#pragma once

#include <string>

#include <cuda_runtime_api.h>

#include "lockstep/runtime/error.h"

namespace lockstep::runtime {

// Number of CUDA devices this process can use. 0 when there is no GPU or no
// usable driver (never throws for that); throws lockstep::Error for any other
// CUDA failure.
int cuda_device_count();

// Empty when cuda_device_count() > 0; otherwise why no device can be used, with
// CUDA's own message (e.g. "no CUDA device found (CUDA driver version is
// insufficient for CUDA runtime version)").
std::string cuda_unavailable_reason();

namespace detail {
// Clears CUDA's last-error state and throws lockstep::Error naming the rank
// (cuda::process_rank_text()), file:line, the call and CUDA's error string and name.
// Used by LOCKSTEP_CUDA_CHECK.
[[noreturn]] void throw_cuda_error(cudaError_t error, const char* expr, const char* file,
                                   int line);

// For destructors, which must not throw: clears CUDA's last-error state and
// writes a warning naming the call and CUDA's message to stderr.
void warn_cuda_error(cudaError_t error, const char* expr) noexcept;
}  // namespace detail

}  // namespace lockstep::runtime

// Evaluates a CUDA runtime call once; throws lockstep::Error unless it returned
// cudaSuccess.  LOCKSTEP_CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyDefault));
#define LOCKSTEP_CUDA_CHECK(expr)                                                    \
  do {                                                                               \
    const cudaError_t lockstep_cuda_error_ = (expr);                                 \
    if (lockstep_cuda_error_ != cudaSuccess)                                         \
      ::lockstep::runtime::detail::throw_cuda_error(lockstep_cuda_error_, #expr,     \
                                                    __FILE__, __LINE__);             \
  } while (0)
