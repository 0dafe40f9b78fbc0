// LOCKSTEP_CUBLAS_CHECK, the one checking macro for cuBLAS calls.
#pragma once

#include <cublas_api.h>

namespace lockstep::runtime::cuda::detail {
// Throws lockstep::Error naming the rank, file:line, the call and cuBLAS's
// status string and name. Used by LOCKSTEP_CUBLAS_CHECK.
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file,
                                     int line);
}  // namespace lockstep::runtime::cuda::detail

// Evaluates a cuBLAS call once; throws lockstep::Error unless it returned
// CUBLAS_STATUS_SUCCESS.  LOCKSTEP_CUBLAS_CHECK(cublasCreate(&handle));
#define LOCKSTEP_CUBLAS_CHECK(expr)                                                  \
  do {                                                                               \
    const cublasStatus_t lockstep_cublas_status_ = (expr);                           \
    if (lockstep_cublas_status_ != CUBLAS_STATUS_SUCCESS)                            \
      ::lockstep::runtime::cuda::detail::throw_cublas_error(lockstep_cublas_status_, \
                                                            #expr, __FILE__, __LINE__); \
  } while (0)
