#include "lockstep/runtime/ops/activation_kernels.h"

#include <algorithm>
#include <type_traits>

#include "lockstep/runtime/cpu/vec_math.h"
#include "lockstep/runtime/cpu/vector_isa.h"
#include "lockstep/runtime/half.h"

// GCC checks the vector ABI at the end of the file: the AVX2 kernels below
// call only always-inlined vector functions (simd.h).
LOCKSTEP_LANES_BEGIN

namespace lockstep::runtime::activation_kernels {
namespace {

using cpu::lanes_of;
using cpu::load_n;
using cpu::store_n;

// Lanes [0, m) of p; the rest 0. A short tail goes through the same vector
// code as the body, so a value's result does not depend on where it is.
template <class V>
LOCKSTEP_LANES_INLINE V load_tail(const float* p, int64_t m) {
  float v[lanes_of<V>] = {};
  for (int64_t u = 0; u < m; ++u) v[u] = p[u];
  return load_n<V>(v);
}

template <class V>
LOCKSTEP_LANES_INLINE void store_tail(float* p, V x, int64_t m) {
  float v[lanes_of<V>];
  store_n(v, x);
  for (int64_t u = 0; u < m; ++u) p[u] = v[u];
}

template <class V>
LOCKSTEP_LANES_INLINE V normal_cdf(V x) {
  return 0.5f * (1.0f + cpu::erf_lanes(x * 0.70710678118654752f));
}

template <class V>
LOCKSTEP_LANES_INLINE V gelu(V x) {
  return x * normal_cdf(x);
}

// d gelu / dx = cdf(x) + x pdf(x).
template <class V>
LOCKSTEP_LANES_INLINE V gelu_grad(V gy, V x) {
  const V pdf = cpu::exp_lanes(-0.5f * x * x) * 0.3989422804014327f;
  return gy * (normal_cdf(x) + x * pdf);
}

template <class V>
LOCKSTEP_LANES_INLINE void forward_lanes(const float* x, float* y, int64_t n) {
  constexpr int L = lanes_of<V>;
  int64_t i = 0;
  for (; i + L <= n; i += L) store_n(y + i, gelu(load_n<V>(x + i)));
  if (i < n) store_tail(y + i, gelu(load_tail<V>(x + i, n - i)), n - i);
}

template <class V>
LOCKSTEP_LANES_INLINE void backward_lanes(const float* gy, const float* x, float* gx, int64_t n) {
  constexpr int L = lanes_of<V>;
  int64_t i = 0;
  for (; i + L <= n; i += L) store_n(gx + i, gelu_grad(load_n<V>(gy + i), load_n<V>(x + i)));
  if (i < n) {
    const V g = gelu_grad(load_tail<V>(gy + i, n - i), load_tail<V>(x + i, n - i));
    store_tail(gx + i, g, n - i);
  }
}

#if LOCKSTEP_HAVE_AVX2_KERNELS
using Wide = cpu::vec_n<float, 32>;
LOCKSTEP_TARGET_AVX2 void forward_avx2(const float* x, float* y, int64_t n) {
  forward_lanes<Wide>(x, y, n);
}
LOCKSTEP_TARGET_AVX2 void backward_avx2(const float* gy, const float* x, float* gx, int64_t n) {
  backward_lanes<Wide>(gy, x, gx, n);
}
#endif

void forward_f32(const float* x, float* y, int64_t n) {
#if LOCKSTEP_HAVE_AVX2_KERNELS
  if (cpu::vector_isa() == cpu::VectorIsa::avx2) return forward_avx2(x, y, n);
#endif
  forward_lanes<cpu::vec_t<float>>(x, y, n);
}

void backward_f32(const float* gy, const float* x, float* gx, int64_t n) {
#if LOCKSTEP_HAVE_AVX2_KERNELS
  if (cpu::vector_isa() == cpu::VectorIsa::avx2) return backward_avx2(gy, x, gx, n);
#endif
  backward_lanes<cpu::vec_t<float>>(gy, x, gx, n);
}

// bf16 and f16 go through the f32 kernels a chunk at a time.
constexpr int64_t kChunk = 1024;

template <class T>
void widen(const T* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
}

template <class T>
void narrow(const float* in, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(in[i]);
}

}  // namespace

template <class T>
void gelu_forward(const T* x, T* y, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    forward_f32(x, y, n);
  } else {
    float buf[kChunk];
    for (int64_t i = 0; i < n; i += kChunk) {
      const int64_t m = std::min(kChunk, n - i);
      widen(x + i, buf, m);
      forward_f32(buf, buf, m);
      narrow(buf, y + i, m);
    }
  }
}

template <class T>
void gelu_backward(const T* grad_y, const T* x, T* grad_x, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    backward_f32(grad_y, x, grad_x, n);
  } else {
    float gy[kChunk], xs[kChunk];
    for (int64_t i = 0; i < n; i += kChunk) {
      const int64_t m = std::min(kChunk, n - i);
      widen(grad_y + i, gy, m);
      widen(x + i, xs, m);
      backward_f32(gy, xs, gy, m);
      narrow(gy, grad_x + i, m);
    }
  }
}

#define LOCKSTEP_GELU_KERNELS(T)                          \
  template void gelu_forward<T>(const T*, T*, int64_t); \
  template void gelu_backward<T>(const T*, const T*, T*, int64_t);
LOCKSTEP_GELU_KERNELS(float)
LOCKSTEP_GELU_KERNELS(bf16)
LOCKSTEP_GELU_KERNELS(f16)
#undef LOCKSTEP_GELU_KERNELS

}  // namespace lockstep::runtime::activation_kernels
