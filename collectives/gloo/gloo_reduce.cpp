#include "lockstep/collectives/gloo/gloo_reduce.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace lockstep::collectives::gloo_backend {
namespace {

using runtime::bf16;
using runtime::f16;

// The type a dtype computes in: float for the 16-bit floats, itself otherwise.
template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, bf16> || std::is_same_v<T, f16>, float, T>;

template <class T, class Combine>
ReduceFn make(Combine combine) {
  return [combine](void* out, const void* a, const void* b, size_t n) {
    auto* o = static_cast<T*>(out);
    const auto* x = static_cast<const T*>(a);
    const auto* y = static_cast<const T*>(b);
    for (size_t i = 0; i < n; ++i) {
      const compute_t<T> l = x[i];
      const compute_t<T> r = y[i];
      o[i] = T(combine(l, r));
    }
  };
}

template <class T>
ReduceFn typed(ReduceOp op) {
  using C = compute_t<T>;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return make<T>([](C l, C r) { return l + r; });
    case ReduceOp::Product: return make<T>([](C l, C r) { return l * r; });
    case ReduceOp::Min: return make<T>([](C l, C r) { return std::min(l, r); });
    case ReduceOp::Max: return make<T>([](C l, C r) { return std::max(l, r); });
  }
  throw Error(fmt::format("gloo: unknown reduce op {}", static_cast<int>(op)));
}

}  // namespace

ReduceFn reduce_function(runtime::DType dtype, ReduceOp op) {
  using runtime::DType;
  switch (dtype) {
    case DType::f32: return typed<float>(op);
    case DType::f64: return typed<double>(op);
    case DType::bf16: return typed<bf16>(op);
    case DType::f16: return typed<f16>(op);
    case DType::i32: return typed<int32_t>(op);
    case DType::i64: return typed<int64_t>(op);
    default: break;
  }
  throw Error(fmt::format("gloo: no reduction for dtype {}; use f32, f64, bf16, f16, i32 or i64",
                          runtime::dtype_name(dtype)));
}

void divide_by(void* data, runtime::DType dtype, size_t n, int divisor) {
  runtime::dispatch_all(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, uint8_t>) {
      throw Error(fmt::format("gloo: cannot average dtype {}", runtime::dtype_name(dtype)));
    } else {
      using C = compute_t<T>;
      auto* p = static_cast<T*>(data);
      const C d = static_cast<C>(divisor);
      for (size_t i = 0; i < n; ++i) p[i] = T(static_cast<C>(p[i]) / d);
    }
  });
}

}  // namespace lockstep::collectives::gloo_backend
