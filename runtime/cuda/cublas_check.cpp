#include "lockstep/runtime/cuda/cublas_check.h"

#include <fmt/format.h>

#include "lockstep/runtime/cuda/core/error_context.h"
#include "lockstep/runtime/cuda/cublas_api.h"
#include "lockstep/runtime/error.h"

namespace lockstep::runtime::cuda::detail {

void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file, int line) {
  const CublasApi& api = cublas();  // loaded: a status comes from a call through it
  throw Error(library_error_message(
      "cuBLAS", expr, file, line,
      fmt::format("{} ({})", api.get_status_string(status), api.get_status_name(status))));
}

}  // namespace lockstep::runtime::cuda::detail
