// LOCKSTEP_CUDNN_CHECK, the one checking macro for cuDNN calls.
#pragma once

#include <cudnn.h>

namespace lockstep::runtime::cuda::detail {
// Throws lockstep::Error naming the rank, file:line, the call, cuDNN's error
// string and, from cuDNN 9 on, cuDNN's last detailed error message. Used by
// LOCKSTEP_CUDNN_CHECK.
[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* expr, const char* file,
                                    int line);
}  // namespace lockstep::runtime::cuda::detail

// Evaluates a cuDNN call once; throws lockstep::Error unless it returned
// CUDNN_STATUS_SUCCESS.  LOCKSTEP_CUDNN_CHECK(cudnnCreate(&handle));
#define LOCKSTEP_CUDNN_CHECK(expr)                                                  \
  do {                                                                              \
    const cudnnStatus_t lockstep_cudnn_status_ = (expr);                            \
    if (lockstep_cudnn_status_ != CUDNN_STATUS_SUCCESS)                             \
      ::lockstep::runtime::cuda::detail::throw_cudnn_error(lockstep_cudnn_status_,  \
                                                           #expr, __FILE__, __LINE__); \
  } while (0)
