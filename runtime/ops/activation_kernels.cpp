#include "lockstep/runtime/ops/activation_kernels.h"

#include "lockstep/runtime/cpu/vec_math.h"
#include "lockstep/runtime/half.h"

namespace lockstep::runtime::activation_kernels {
namespace {

using cpu::vec_t;
constexpr int L = cpu::kLanes<float>;

// Lanes [0, m) of p as floats; the rest 0. A short tail goes through the same
// vector code as the body, so a value's result does not depend on where it is.
template <class T>
vec_t<float> load_lanes(const T* p, int64_t m) {
  float v[L] = {};
  for (int64_t u = 0; u < m; ++u) v[u] = static_cast<float>(p[u]);
  return cpu::load(v);
}

template <class T>
void store_lanes(T* p, vec_t<float> x, int64_t m) {
  float v[L];
  cpu::store(v, x);
  for (int64_t u = 0; u < m; ++u) p[u] = static_cast<T>(v[u]);
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

}  // namespace

template <class T>
void gelu_forward(const T* x, T* y, int64_t n) {
  for_blocks(n, [&](int64_t i, int64_t m) {
    const vec_t<float> v = load_lanes(x + i, m);
    store_lanes(y + i, v * normal_cdf(v), m);
  });
}

template <class T>
void gelu_backward(const T* grad_y, const T* x, T* grad_x, int64_t n) {
  for_blocks(n, [&](int64_t i, int64_t m) {
    const vec_t<float> v = load_lanes(x + i, m);
    const vec_t<float> pdf = cpu::exp_lanes(-0.5f * v * v) * 0.3989422804014327f;
    store_lanes(grad_x + i, load_lanes(grad_y + i, m) * (normal_cdf(v) + v * pdf), m);
  });
}

#define LOCKSTEP_GELU_KERNELS(T)                          \
  template void gelu_forward<T>(const T*, T*, int64_t); \
  template void gelu_backward<T>(const T*, const T*, T*, int64_t);
LOCKSTEP_GELU_KERNELS(float)
LOCKSTEP_GELU_KERNELS(bf16)
LOCKSTEP_GELU_KERNELS(f16)
#undef LOCKSTEP_GELU_KERNELS

}  // namespace lockstep::runtime::activation_kernels
