#include "lockstep/runtime/ops/activation_kernels.h"

#include <algorithm>
#include <type_traits>

#include "lockstep/runtime/cpu/vec_math.h"
#include "lockstep/runtime/half.h"

namespace lockstep::runtime::activation_kernels {
namespace {

using cpu::vec_t;
constexpr int L = cpu::kLanes<float>;

// Lanes [0, m) of p; the rest 0. A short tail goes through the same vector
// code as the body, so a value's result does not depend on where it is.
vec_t<float> load_lanes(const float* p, int64_t m) {
  float v[L] = {};
  for (int64_t u = 0; u < m; ++u) v[u] = p[u];
  return cpu::load(v);
}

void store_lanes(float* p, vec_t<float> x, int64_t m) {
  float v[L];
  cpu::store(v, x);
  for (int64_t u = 0; u < m; ++u) p[u] = v[u];
}

vec_t<float> normal_cdf(vec_t<float> x) {
  return 0.5f * (1.0f + cpu::erf_lanes(x * 0.70710678118654752f));
}

// step(i, m) over [i, i + m) for every L-wide block of [0, n), then the tail;
// m is the constant L in the body, so the lane loops unroll.
template <class F>
void for_blocks(int64_t n, F step) {
  int64_t i = 0;
  for (; i + L <= n; i += L) step(i, L);
  if (i < n) step(i, n - i);
}

void forward_f32(const float* x, float* y, int64_t n) {
  for_blocks(n, [&](int64_t i, int64_t m) {
    const vec_t<float> v = load_lanes(x + i, m);
    store_lanes(y + i, v * normal_cdf(v), m);
  });
}

void backward_f32(const float* grad_y, const float* x, float* grad_x, int64_t n) {
  for_blocks(n, [&](int64_t i, int64_t m) {
    const vec_t<float> v = load_lanes(x + i, m);
    const vec_t<float> pdf = cpu::exp_lanes(-0.5f * v * v) * 0.3989422804014327f;
    store_lanes(grad_x + i, load_lanes(grad_y + i, m) * (normal_cdf(v) + v * pdf), m);
  });
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
