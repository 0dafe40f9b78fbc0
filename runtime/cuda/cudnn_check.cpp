#include "lockstep/runtime/cuda/cudnn_check.h"

#include <string>

#include "lockstep/runtime/cuda/core/error_context.h"
#include "lockstep/runtime/error.h"

namespace lockstep::runtime::cuda::detail {

void throw_cudnn_error(cudnnStatus_t status, const char* expr, const char* file, int line) {
  std::string detail = cudnnGetErrorString(status);
#if CUDNN_MAJOR >= 9
  // The detailed message of the last failed call, if cuDNN kept one (reading it
  // clears it).
  char last[512] = {};
  cudnnGetLastErrorString(last, sizeof last);
  if (last[0] != '\0') detail += fmt::format(" ({})", last);
#endif
  throw Error(library_error_message("cuDNN", expr, file, line, detail));
}

}  // namespace lockstep::runtime::cuda::detail
