#include "lockstep/collectives/mpi/mpi_types.h"

#include <mutex>

#include <fmt/format.h>

#include "lockstep/collectives/mpi/mpi_runtime.h"
#include "lockstep/collectives/reduce_kernels.h"

namespace lockstep::collectives::mpi {
namespace {

using runtime::DType;

// MPI_User_function: inout[i] = in[i] (op) inout[i], with reduce_kernels.h's
// arithmetic: 16-bit floats combine in float; Max and Min keep a NaN from
// either side (MPI_MAX's a > b ? a : b dropped one held by a later rank).
template <DType D, ReduceOp Op>
void kernel_reduce(void* in, void* inout, int* len, MPI_Datatype* /*datatype*/) {
  combine(D, Op, inout, in, inout, static_cast<size_t>(*len));
}

// Index: [0] bf16, [1] f16, [2] f32, [3] f64, [4] u8; then sum, product, min,
// max (f32 and f64 use MPI's own sum and product: MPI_OP_NULL here). u8 has
// all four of its own: Open MPI's MPI_SUM of MPI_UINT8_T saturates at 255 (its
// vectorised op), where PyTorch's wraps modulo 256.
struct KernelOps {
  MPI_Op ops[5][4];
};

template <DType D>
void create_ops(MPI_Op* out, bool with_sum_and_product) {
  out[0] = out[1] = MPI_OP_NULL;
  if (with_sum_and_product) {
    LOCKSTEP_MPI_CHECK(MPI_Op_create(&kernel_reduce<D, ReduceOp::Sum>, 1, &out[0]));
    LOCKSTEP_MPI_CHECK(MPI_Op_create(&kernel_reduce<D, ReduceOp::Product>, 1, &out[1]));
  }
  LOCKSTEP_MPI_CHECK(MPI_Op_create(&kernel_reduce<D, ReduceOp::Min>, 1, &out[2]));
  LOCKSTEP_MPI_CHECK(MPI_Op_create(&kernel_reduce<D, ReduceOp::Max>, 1, &out[3]));
}

// MPI_Finalize deletes MPI_COMM_SELF's attributes before anything else (MPI
// 4.0, section 11.2.4), whoever calls it: the ops are freed there.
int free_ops_at_finalize(MPI_Comm, int, void* attribute, void*) {
  for (auto& per_dtype : static_cast<KernelOps*>(attribute)->ops)
    for (MPI_Op& op : per_dtype) {
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
    }
  return MPI_SUCCESS;
}

// Created once, on first use; freed by MPI_Finalize.
const KernelOps& kernel_ops() {
  static std::once_flag once;
  static KernelOps ops;
  std::call_once(once, [] {
    create_ops<DType::bf16>(ops.ops[0], true);
    create_ops<DType::f16>(ops.ops[1], true);
    create_ops<DType::f32>(ops.ops[2], false);
    create_ops<DType::f64>(ops.ops[3], false);
    create_ops<DType::u8>(ops.ops[4], true);
    int key = MPI_KEYVAL_INVALID;
    LOCKSTEP_MPI_CHECK(
        MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_ops_at_finalize, &key, nullptr));
    LOCKSTEP_MPI_CHECK(MPI_Comm_set_attr(MPI_COMM_SELF, key, &ops));
    LOCKSTEP_MPI_CHECK(MPI_Comm_free_keyval(&key));  // the attribute keeps it until then
  });
  return ops;
}

int op_index(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return 0;
    case ReduceOp::Product: return 1;
    case ReduceOp::Min: return 2;
    case ReduceOp::Max: return 3;
  }
  throw Error(fmt::format("mpi backend: unknown reduce op {}", static_cast<int>(op)));
}

}  // namespace

MPI_Datatype mpi_datatype(DType dtype) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::bf16:
    case DType::f16: return MPI_UINT16_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::boolean: return MPI_C_BOOL;
  }
  throw Error(fmt::format("mpi backend: dtype {} has no collective support",
                          runtime::dtype_name(dtype)));
}

MPI_Op mpi_op(ReduceOp op, DType dtype) {
  const int i = op_index(op);
  // MPI defines only the logical ops on MPI_C_BOOL: Sum and Max are its or,
  // Product and Min its and (reduce_kernels.h).
  if (dtype == DType::boolean) return i == 0 || i == 3 ? MPI_LOR : MPI_LAND;
  if (dtype == DType::u8) return kernel_ops().ops[4][i];
  if (dtype == DType::bf16 || dtype == DType::f16) {
    return kernel_ops().ops[dtype == DType::bf16 ? 0 : 1][i];
  }
  if ((dtype == DType::f32 || dtype == DType::f64) && i >= 2) {
    return kernel_ops().ops[dtype == DType::f32 ? 2 : 3][i];
  }
  static const MPI_Op builtin[4] = {MPI_SUM, MPI_PROD, MPI_MIN, MPI_MAX};
  return builtin[i];
}

}  // namespace lockstep::collectives::mpi
