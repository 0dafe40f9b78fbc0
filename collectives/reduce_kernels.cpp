#include "lockstep/collectives/reduce_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace lockstep::collectives {
namespace {

using runtime::bf16;
using runtime::f16;

// The type a dtype computes in: float for the 16-bit floats, itself otherwise.
template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, bf16> || std::is_same_v<T, f16>, float, T>;

// A plain indexed loop the compiler vectorises (with a runtime overlap check,
// since out may alias a or b).
template <class T, class Combine>
void apply(void* out, const void* a, const void* b, size_t n, Combine combine) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    const compute_t<T> l = x[i];
    const compute_t<T> r = y[i];
    o[i] = T(combine(l, r));
  }
}

// Max and Min where a NaN on either side wins, as torch.maximum's does:
// std::max keeps its left operand against a NaN, so a NaN survived or was
// dropped depending on which rank held it and on how the tensor was sliced.
// For the same reason +0 is the larger of the two zeros (IEEE 754's maximum
// and minimum): comparing equal, the left one was kept, so the sign of a Max
// or Min of -0 and +0 depended on the rank order, the backend and the slice.
template <class C>
C max_of(C l, C r) {
  if constexpr (std::is_floating_point_v<C>) {
    if (r != r) return r;
    if (l == r) return std::signbit(l) ? r : l;
  }
  return l < r ? r : l;  // a NaN on the left stays
}
template <class C>
C min_of(C l, C r) {
  if constexpr (std::is_floating_point_v<C>) {
    if (r != r) return r;
    if (l == r) return std::signbit(l) ? l : r;
  }
  return r < l ? r : l;
}

// Integer Sum and Product wrap around in two's complement, as NCCL's and
// gloo's do: computed in the unsigned type, since a signed overflow is
// undefined (and stopped the process in a -fsanitize=undefined build).
template <class C>
C sum_of(C l, C r) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(l) + static_cast<U>(r));
  } else {
    return l + r;
  }
}
template <class C>
C product_of(C l, C r) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(l) * static_cast<U>(r));
  } else {
    return l * r;
  }
}

template <class T>
void typed(ReduceOp op, void* out, const void* a, const void* b, size_t n) {
  using C = compute_t<T>;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return apply<T>(out, a, b, n, [](C l, C r) { return sum_of(l, r); });
    case ReduceOp::Product:
      return apply<T>(out, a, b, n, [](C l, C r) { return product_of(l, r); });
    case ReduceOp::Min: return apply<T>(out, a, b, n, [](C l, C r) { return min_of(l, r); });
    case ReduceOp::Max: return apply<T>(out, a, b, n, [](C l, C r) { return max_of(l, r); });
  }
  throw Error(fmt::format("collectives: unknown reduce op {}", static_cast<int>(op)));
}

// bool, as PyTorch reduces it: Sum and Max are a logical or, Product and
// Min a logical and (each element read as a byte, so any nonzero one is
// true). Avg of bool is refused (ProcessGroup refuses it before sending).
void logical(ReduceOp op, void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<uint8_t*>(out);
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* y = static_cast<const uint8_t*>(b);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Max:
      for (size_t i = 0; i < n; ++i) o[i] = static_cast<uint8_t>((x[i] != 0) | (y[i] != 0));
      return;
    case ReduceOp::Product:
    case ReduceOp::Min:
      for (size_t i = 0; i < n; ++i) o[i] = static_cast<uint8_t>((x[i] != 0) & (y[i] != 0));
      return;
    case ReduceOp::Avg: break;
  }
  throw Error(fmt::format("collectives: cannot reduce dtype bool with {}", to_string(op)));
}

}  // namespace

void combine(runtime::DType dtype, ReduceOp op, void* out, const void* a, const void* b, size_t n) {
  using runtime::DType;
  switch (dtype) {
    case DType::f32: return typed<float>(op, out, a, b, n);
    case DType::f64: return typed<double>(op, out, a, b, n);
    case DType::bf16: return typed<bf16>(op, out, a, b, n);
    case DType::f16: return typed<f16>(op, out, a, b, n);
    case DType::i32: return typed<int32_t>(op, out, a, b, n);
    case DType::i64: return typed<int64_t>(op, out, a, b, n);
    case DType::u8: return typed<uint8_t>(op, out, a, b, n);
    case DType::boolean: return logical(op, out, a, b, n);
  }
  throw Error(fmt::format("collectives: no reduction for dtype {}", runtime::dtype_name(dtype)));
}

void divide_by(void* data, runtime::DType dtype, size_t n, int divisor) {
  runtime::dispatch_all(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, uint8_t>) {
      throw Error(fmt::format("collectives: cannot average dtype {}", runtime::dtype_name(dtype)));
    } else {
      using C = compute_t<T>;
      auto* p = static_cast<T*>(data);
      const C d = static_cast<C>(divisor);
      for (size_t i = 0; i < n; ++i) p[i] = T(static_cast<C>(p[i]) / d);
    }
  });
}

}  // namespace lockstep::collectives
