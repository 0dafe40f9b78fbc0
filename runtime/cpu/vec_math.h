// exp and erf on vectors of f32 lanes for the CPU kernels (softmax,
// attention, GELU): libm takes one value per call, which was a fifth of a
// transformer's step. Written once for any width V (vec_t<float>: 4 lanes;
// vec_n<float, 32>: AVX2's 8, see vector_isa.h) and always inlined, so each
// kernel compiles them for its own instruction set. Within one variant a
// value gets the same result in every lane and at every position of an array.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "lockstep/runtime/cpu/simd.h"

namespace lockstep::runtime::cpu {

LOCKSTEP_LANES_BEGIN

// exp(x) for x <= 0: Cephes' expf, exp(x) = 2^n exp(r) with |r| <= ln(2) / 2
// and a degree-6 polynomial, within 1 ulp of exp on [-87, 0] (1.02 in the
// AVX2 variant, whose fused multiply-adds round differently; exhaustive
// searches). 0 below -87, where expf leaves the normal range; NaN stays NaN.
template <class V>
LOCKSTEP_LANES_INLINE V exp_lanes(V x) {
  using I = int_lanes_t<V>;
  const V lo = splat_n<V>(-87.0f), zero = {};
  const V xc = x < lo ? lo : x;
  const V t = xc * 1.44269504088896341f + 0.5f;  // x log2(e) + 1/2
  I n = __builtin_convertvector(t, I);
  n += __builtin_convertvector(n, V) > t;  // floor: truncation rounded up
  const V nf = __builtin_convertvector(n, V);
  const V r = xc - nf * 0.693359375f - nf * -2.12194440e-4f;  // x - n ln(2)
  V p = splat_n<V>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const I bits = (n + 127) << 23;  // 2^n
  V two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  const V e = (p * r * r + r + 1.0f) * two_n;
  return x < lo ? zero : (x != x ? x : e);
}

// erf(x), within 1.3 ulp of erf (exhaustive searches found 1.24, and 1.20 in
// the AVX2 variant). Two pieces:
//   |x| <  0.921875: erf(x) = x + x P(x^2), P of degree 6 (erf(x) / x - 1);
//   |x| >= 0.921875: erf(x) = sign(x) (1 - exp(Q(|x|))), Q of degree 6 near
//                    log(erfc), fitted where erfc weighs its error;
// |x| is clamped at 4, past which erf rounds to +-1 in f32. Coefficients are
// least-squares fits at Chebyshev nodes against 40-digit erf. NaN stays NaN.
// The second piece is skipped when no lane needs it (the common case for a
// network's activations); each lane's result is the same either way.
template <class V>
LOCKSTEP_LANES_INLINE V erf_lanes(V x) {
  using I = int_lanes_t<V>;
  const V t = x < 0.0f ? -x : x;
  const V s = x * x;
  V p = splat_n<V>(8.39378336e-05f);
  p = p * s + -8.14880594e-04f;
  p = p * s + 5.20162378e-03f;
  p = p * s + -2.68596634e-02f;
  p = p * s + 1.12837009e-01f;
  p = p * s + -3.76126349e-01f;
  p = p * s + 1.28379166e-01f;
  const V near = x + x * p;
  const I is_near = t < 0.921875f;
  int32_t all_near = -1;
  for (int u = 0; u < lanes_of<V>; ++u) all_near &= is_near[u];
  if (__builtin_expect(all_near != 0, 1)) return near;
  const V tc = t < 4.0f ? t : splat_n<V>(4.0f);
  V q = splat_n<V>(1.96010093e-04f);
  q = q * tc + -3.04334424e-03f;
  q = q * tc + 2.22253688e-02f;
  q = q * tc + -1.03924662e-01f;
  q = q * tc + -6.37193799e-01f;
  q = q * tc + -1.12766695e+00f;
  q = q * tc + -1.98162612e-04f;
  const V tail = 1.0f - exp_lanes(q);
  const V far = x < 0.0f ? -tail : tail;
  return is_near ? near : (x != x ? x : far);
}

// out[i] = exp(in[i] - shift) for i < n (out may be in; nullptr: not stored),
// shift being the row's maximum so that every exponent is <= 0; returns
// their sum. The last, short block goes through the lanes too, so a value's
// result does not depend on where it sits.
template <class V>
LOCKSTEP_LANES_INLINE float exp_shifted_lanes(const float* in, float* out, int64_t n, float shift) {
  constexpr int L = lanes_of<V>;
  const V sh = splat_n<V>(shift);
  V sum = {};
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const V e = exp_lanes(load_n<V>(in + i) - sh);
    if (out) store_n(out + i, e);
    sum += e;
  }
  if (i < n) {
    float v[L] = {}, e[L];
    for (int64_t u = 0; u < n - i; ++u) v[u] = in[i + u];
    store_n(e, exp_lanes(load_n<V>(v) - sh));
    for (int64_t u = 0; u < n - i; ++u) {
      if (out) out[i + u] = e[u];
      sum[u] += e[u];
    }
  }
  double total = 0;
  for (int u = 0; u < L; ++u) total += sum[u];
  return static_cast<float>(total);
}

LOCKSTEP_LANES_END

// The largest of p[0, n), -inf when n is 0, NaN when any entry is NaN (a
// softmax row then comes out NaN, as PyTorch's does). Two vectors of running
// maxima: a scalar loop waits on each comparison.
inline float row_max(const float* p, int64_t n) {
  using V = vec_t<float>;
  using I = int_lanes_t<V>;
  constexpr int L = kLanes<float>;
  V m0 = splat(-INFINITY), m1 = m0;
  I nan = {};
  int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    const V a = load(p + i), b = load(p + i + L);
    m0 = a > m0 ? a : m0;
    m1 = b > m1 ? b : m1;
    nan |= (a != a) | (b != b);
  }
  m0 = m1 > m0 ? m1 : m0;
  float m = -INFINITY;
  bool any_nan = false;
  for (int u = 0; u < L; ++u) m = m0[u] > m ? m0[u] : m, any_nan |= nan[u] != 0;
  for (; i < n; ++i) m = p[i] > m ? p[i] : m, any_nan |= p[i] != p[i];
  return any_nan ? NAN : m;
}

inline double row_max(const double* p, int64_t n) {
  double m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] != p[i]) return p[i];
    m = p[i] > m ? p[i] : m;
  }
  return m;
}

// The softmax rows of attention, softmax, log_softmax and cross_entropy:
// exp_shifted_lanes in the variant vector_isa() names.
float exp_shifted(const float* in, float* out, int64_t n, float shift);

// The same in f64, through libm.
inline double exp_shifted(const double* in, double* out, int64_t n, double shift) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double e = std::exp(in[i] - shift);
    if (out) out[i] = e;
    total += e;
  }
  return total;
}

}  // namespace lockstep::runtime::cpu
