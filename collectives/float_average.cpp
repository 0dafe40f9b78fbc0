#include "lockstep/collectives/float_average.h"

#include <type_traits>

#include "lockstep/runtime/half.h"

namespace lockstep::collectives {
namespace {

using runtime::DType;
using runtime::Tensor;

bool is_16bit_float(DType dtype) { return dtype == DType::bf16 || dtype == DType::f16; }

// `fn(Half{})` with the 16-bit float type of `dtype`.
template <class Fn>
void with_half(DType dtype, Fn&& fn) {
  if (dtype == DType::bf16) {
    fn(runtime::bf16{});
  } else {
    fn(runtime::f16{});
  }
}

}  // namespace

DType reduction_dtype(DType dtype, ReduceOp op) {
  return op == ReduceOp::Avg && is_16bit_float(dtype) ? DType::f32 : dtype;
}

Tensor in_reduction_dtype(const Tensor& t, ReduceOp op, bool with_values) {
  const DType to = reduction_dtype(t.dtype(), op);
  if (to == t.dtype()) return t;
  Tensor wide = Tensor::empty(t.shape(), to);
  if (!with_values) return wide;
  auto* out = static_cast<float*>(wide.raw_data());
  const int64_t n = t.numel();
  with_half(t.dtype(), [&](auto half) {
    const auto* in = static_cast<const decltype(half)*>(t.raw_data());
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
  });
  return wide;
}

void write_back(const Tensor& t, const Tensor& reduced) {
  if (reduced.is_same(t)) return;
  LOCKSTEP_ASSERT(reduced.dtype() == DType::f32 && reduced.numel() == t.numel());
  const auto* in = static_cast<const float*>(reduced.raw_data());
  const int64_t n = t.numel();
  with_half(t.dtype(), [&](auto half) {
    using Half = decltype(half);
    auto* out = static_cast<Half*>(t.raw_data());
    for (int64_t i = 0; i < n; ++i) out[i] = Half(in[i]);
  });
}

}  // namespace lockstep::collectives
