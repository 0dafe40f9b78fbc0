#include "lockstep/collectives/nccl/nccl_check.h"

#include <string>

#include <fmt/format.h>

#include "lockstep/runtime/cuda/core/error_context.h"
#include "lockstep/runtime/error.h"

namespace lockstep::collectives::detail {

void throw_nccl_error(ncclResult_t result, const char* expr, const char* file, int line) {
  std::string detail = ncclGetErrorString(result);
  // The communicator argument is unused by NCCL: the last error of any.
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && last[0] != '\0') detail += fmt::format(" (last NCCL error: {})", last);
  throw Error(runtime::cuda::library_error_message("NCCL", expr, file, line, detail));
}

}  // namespace lockstep::collectives::detail
