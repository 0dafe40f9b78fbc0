// The one place that looks at NCCL's version, and the mapping of lockstep's
// dtypes and reduce ops to NCCL's. Part of the NCCL backend (built only with
// LOCKSTEP_HAVE_NCCL).
#pragma once

// NCCL before 2.19 declares ncclBfloat16 only once cuda_bf16.h is included.
#include <cuda_bf16.h>
#include <nccl.h>

#include "lockstep/collectives/types.h"
#include "lockstep/runtime/dtype.h"

// ncclAvg and ncclBfloat16 came in 2.10, ncclGetLastError (nccl_check.cpp) in
// 2.13, non-blocking communicators (nccl_comm.cpp) in 2.14.
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "lockstep's NCCL backend needs NCCL 2.14 or newer (or configure with -DLOCKSTEP_NCCL=OFF)"
#endif

namespace lockstep::collectives::detail {

// f32, f64, bf16, f16, i32, i64; anything else throws lockstep::Error
// (ProcessGroup::check_tensor refuses those dtypes before this is reached).
ncclDataType_t nccl_dtype(runtime::DType dtype);

// Avg is NCCL's own ncclAvg (integers truncate toward zero, as types.h says).
ncclRedOp_t nccl_op(ReduceOp op);

}  // namespace lockstep::collectives::detail
