// LOCKSTEP_NCCL_CHECK, the one checking macro for NCCL calls. Part of the NCCL
// backend: compiled and installed only when LOCKSTEP_HAVE_NCCL (NCCL is linked
// to lockstep::collectives, not to lockstep::runtime).
#pragma once

#include <nccl.h>

namespace lockstep::collectives::detail {
// Throws lockstep::Error naming the rank, file:line, the call, NCCL's error
// string and NCCL's last error message (ncclGetLastError). Used by
// LOCKSTEP_NCCL_CHECK. ncclInProgress is not an error for non-blocking
// communicators: check for it before using this macro where it can occur.
[[noreturn]] void throw_nccl_error(ncclResult_t result, const char* expr, const char* file,
                                   int line);
}  // namespace lockstep::collectives::detail

// Evaluates an NCCL call once; throws lockstep::Error unless it returned
// ncclSuccess.  LOCKSTEP_NCCL_CHECK(ncclCommInitRank(&comm, n, id, rank));
#define LOCKSTEP_NCCL_CHECK(expr)                                                  \
  do {                                                                             \
    const ncclResult_t lockstep_nccl_result_ = (expr);                             \
    if (lockstep_nccl_result_ != ncclSuccess)                                      \
      ::lockstep::collectives::detail::throw_nccl_error(lockstep_nccl_result_,     \
                                                        #expr, __FILE__, __LINE__); \
  } while (0)

// The same for calls on a non-blocking communicator inside NcclComm::use(),
// where ncclInProgress means "accepted, still being enqueued" (use() waits
// for it to finish).
#define LOCKSTEP_NCCL_CHECK_ASYNC(expr)                                            \
  do {                                                                             \
    const ncclResult_t lockstep_nccl_result_ = (expr);                             \
    if (lockstep_nccl_result_ != ncclSuccess &&                                    \
        lockstep_nccl_result_ != ncclInProgress)                                   \
      ::lockstep::collectives::detail::throw_nccl_error(lockstep_nccl_result_,     \
                                                        #expr, __FILE__, __LINE__); \
  } while (0)
