// Device-side helpers shared by the .cu kernels: the C++ type of each
// ScalarType, conversions between them, the type arithmetic runs in, the
// offsets of one element of a strided iteration, and launch geometry.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "lockstep/runtime/cuda/kernels/kernel_types.h"

namespace lockstep::runtime::cuda::kernels {

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

// Arithmetic type: f32 for the 16-bit floats (stored narrow, computed wide).
template <class T>
using compute_t = std::conditional_t<is_half_v<T>, float, T>;

// Element conversion with the CPU's semantics (runtime/ops/detail/convert.h): to
// bool is "!= 0"; 16-bit floats go through f32, rounding to nearest even.
template <class D, class S>
__host__ __device__ __forceinline__ D convert(S v) {
  if constexpr (std::is_same_v<D, S>) {
    return v;
  } else if constexpr (is_half_v<S>) {
    return convert<D>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<D, bool>) {
    return v != S(0);
  } else if constexpr (std::is_same_v<D, __half>) {
    return __float2half_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<D, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else {
    return static_cast<D>(v);
  }
}

// Calls fn(T{}) with T the device type of `t`; returns what fn returns.
template <class Fn>
__host__ auto dispatch_scalar_type(ScalarType t, Fn&& fn) {
  switch (t) {
    case ScalarType::f32: return fn(float{});
    case ScalarType::f64: return fn(double{});
    case ScalarType::bf16: return fn(__nv_bfloat16{});
    case ScalarType::f16: return fn(__half{});
    case ScalarType::i32: return fn(int32_t{});
    case ScalarType::i64: return fn(int64_t{});
    case ScalarType::u8: return fn(uint8_t{});
    case ScalarType::boolean: return fn(bool{});
  }
  return fn(float{});  // unreachable: every enumerator is handled above
}

// Offsets (in elements) of linear element `i` of the iteration in each operand.
template <int N>
__device__ __forceinline__ void element_offsets(const ElementwiseArgs<N>& a, int64_t i,
                                                int64_t (&off)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) off[k] = 0;
  for (int d = a.ndim - 1; d >= 0; --d) {
    const int64_t size = a.sizes[d];
    const int64_t idx = i % size;
    i /= size;
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] += idx * a.strides[k][d];
  }
}

inline constexpr int kBlock = 256;

// Blocks for `n` work items of kBlock threads each; kernels loop over the
// rest (grid-stride), so the grid stays within CUDA's limits.
inline unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  constexpr int64_t kMaxBlocks = int64_t{1} << 20;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

}  // namespace lockstep::runtime::cuda::kernels
