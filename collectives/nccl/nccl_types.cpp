#include "lockstep/collectives/nccl/nccl_types.h"

#include "lockstep/runtime/error.h"

namespace lockstep::collectives::detail {

ncclDataType_t nccl_dtype(runtime::DType dtype) {
  using runtime::DType;
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    default: break;
  }
  throw Error(fmt::format("nccl: dtype {} has no NCCL equivalent; use f32, f64, bf16, f16, i32 "
                          "or i64",
                          runtime::dtype_name(dtype)));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Product: return ncclProd;
  }
  throw Error(fmt::format("nccl: unknown reduce op {}", static_cast<int>(op)));
}

}  // namespace lockstep::collectives::detail
