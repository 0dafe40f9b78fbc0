#include "lockstep/collectives/mpi/mpi_types.h"

#include <mutex>

#include <fmt/format.h>

#include "lockstep/collectives/mpi/mpi_runtime.h"
#include "lockstep/runtime/half.h"

namespace lockstep::collectives::mpi {
namespace {

using runtime::DType;

struct Add {
  float operator()(float a, float b) const { return a + b; }
};
struct Mul {
  float operator()(float a, float b) const { return a * b; }
};
struct Min {
  float operator()(float a, float b) const { return b < a ? b : a; }
};
struct Max {
  float operator()(float a, float b) const { return a < b ? b : a; }
};

// MPI_User_function: inout[i] = in[i] (op) inout[i], in float.
template <class Half, class Combine>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype* /*datatype*/) {
  const auto* a = static_cast<const Half*>(in);
  auto* b = static_cast<Half*>(inout);
  const Combine combine;
  for (int i = 0; i < *len; ++i) b[i] = Half(combine(float(a[i]), float(b[i])));
}

// Index: [0] bf16, [1] f16; then sum, product, min, max.
struct HalfOps {
  MPI_Op ops[2][4];
};

template <class Half>
void create_ops(MPI_Op* out) {
  LOCKSTEP_MPI_CHECK(MPI_Op_create(&half_reduce<Half, Add>, 1, &out[0]));
  LOCKSTEP_MPI_CHECK(MPI_Op_create(&half_reduce<Half, Mul>, 1, &out[1]));
  LOCKSTEP_MPI_CHECK(MPI_Op_create(&half_reduce<Half, Min>, 1, &out[2]));
  LOCKSTEP_MPI_CHECK(MPI_Op_create(&half_reduce<Half, Max>, 1, &out[3]));
}

// MPI_Finalize deletes MPI_COMM_SELF's attributes before anything else (MPI
// 4.0, section 11.2.4), whoever calls it: the ops are freed there.
int free_ops_at_finalize(MPI_Comm, int, void* attribute, void*) {
  for (auto& per_dtype : static_cast<HalfOps*>(attribute)->ops)
    for (MPI_Op& op : per_dtype) MPI_Op_free(&op);
  return MPI_SUCCESS;
}

// Created once, on first use; freed by MPI_Finalize.
const HalfOps& half_ops() {
  static std::once_flag once;
  static HalfOps ops;
  std::call_once(once, [] {
    create_ops<runtime::bf16>(ops.ops[0]);
    create_ops<runtime::f16>(ops.ops[1]);
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
    default: break;
  }
  throw Error(fmt::format("mpi backend: dtype {} has no collective support; use f32, f64, bf16, "
                          "f16, i32 or i64",
                          runtime::dtype_name(dtype)));
}

MPI_Op mpi_op(ReduceOp op, DType dtype) {
  if (dtype == DType::bf16 || dtype == DType::f16) {
    return half_ops().ops[dtype == DType::bf16 ? 0 : 1][op_index(op)];
  }
  static const MPI_Op builtin[4] = {MPI_SUM, MPI_PROD, MPI_MIN, MPI_MAX};
  return builtin[op_index(op)];
}

}  // namespace lockstep::collectives::mpi
