// exp and erf on four f32 lanes for the CPU kernels (softmax, attention,
// GELU): libm takes one value per call, which was a fifth of a transformer's
// step. A value gets the same result in every lane and at every position of
// an array.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "lockstep/runtime/cpu/simd.h"

namespace lockstep::runtime::cpu {

typedef int32_t vec_i32 __attribute__((vector_size(16)));

// exp(x) for x <= 0: Cephes' expf, exp(x) = 2^n exp(r) with |r| <= ln(2) / 2
// and a degree-6 polynomial, within 1 ulp of exp on [-87, 0]. 0 below -87,
// where expf leaves the normal range; NaN stays NaN.
inline vec_t<float> exp_lanes(vec_t<float> x) {
  const vec_t<float> lo = splat(-87.0f), zero = {};
  const vec_t<float> xc = x < lo ? lo : x;
  const vec_t<float> t = xc * 1.44269504088896341f + 0.5f;  // x log2(e) + 1/2
  vec_i32 n = __builtin_convertvector(t, vec_i32);
  n += __builtin_convertvector(n, vec_t<float>) > t;  // floor: truncation rounded up
  const vec_t<float> nf = __builtin_convertvector(n, vec_t<float>);
  const vec_t<float> r = xc - nf * 0.693359375f - nf * -2.12194440e-4f;  // x - n ln(2)
  vec_t<float> p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const vec_i32 bits = (n + 127) << 23;  // 2^n
  vec_t<float> two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  const vec_t<float> e = (p * r * r + r + 1.0f) * two_n;
  return x < lo ? zero : (x != x ? x : e);
}

// erf(x), within 1.3 ulp of erf (an exhaustive search found 1.24). Two pieces:
//   |x| <  0.921875: erf(x) = x + x P(x^2), P of degree 6 (erf(x) / x - 1);
//   |x| >= 0.921875: erf(x) = sign(x) (1 - exp(Q(|x|))), Q of degree 6 near
//                    log(erfc), fitted where erfc weighs its error;
// |x| is clamped at 4, past which erf rounds to +-1 in f32. Coefficients are
// least-squares fits at Chebyshev nodes against 40-digit erf. NaN stays NaN.
// The second piece is skipped when no lane needs it (the common case for a
// network's activations); each lane's result is the same either way.
inline vec_t<float> erf_lanes(vec_t<float> x) {
  const vec_t<float> t = x < 0.0f ? -x : x;
  const vec_t<float> s = x * x;
  vec_t<float> p = splat(8.39378336e-05f);
  p = p * s + -8.14880594e-04f;
  p = p * s + 5.20162378e-03f;
  p = p * s + -2.68596634e-02f;
  p = p * s + 1.12837009e-01f;
  p = p * s + -3.76126349e-01f;
  p = p * s + 1.28379166e-01f;
  const vec_t<float> near = x + x * p;
  const vec_i32 is_near = t < 0.921875f;
  if (__builtin_expect((is_near[0] & is_near[1] & is_near[2] & is_near[3]) != 0, 1)) return near;
  const vec_t<float> tc = t < 4.0f ? t : splat(4.0f);
  vec_t<float> q = splat(1.96010093e-04f);
  q = q * tc + -3.04334424e-03f;
  q = q * tc + 2.22253688e-02f;
  q = q * tc + -1.03924662e-01f;
  q = q * tc + -6.37193799e-01f;
  q = q * tc + -1.12766695e+00f;
  q = q * tc + -1.98162612e-04f;
  const vec_t<float> tail = 1.0f - exp_lanes(q);
  const vec_t<float> far = x < 0.0f ? -tail : tail;
  return is_near ? near : (x != x ? x : far);
}

// out[i] = exp(in[i] - shift) for i < n (out may be in; nullptr: not
// stored), shift being the row's maximum so that every exponent is <= 0;
// returns their sum. The softmax rows of attention, softmax, log_softmax and
// cross_entropy. The last, short block goes through the lanes too, so a
// value's result does not depend on where it sits.
inline float exp_shifted(const float* in, float* out, int64_t n, float shift) {
  constexpr int L = kLanes<float>;
  const vec_t<float> sh = splat(shift);
  vec_t<float> sum = {};
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const vec_t<float> e = exp_lanes(load(in + i) - sh);
    if (out) store(out + i, e);
    sum += e;
  }
  if (i < n) {
    float v[L] = {}, e[L];
    for (int64_t u = 0; u < n - i; ++u) v[u] = in[i + u];
    store(e, exp_lanes(load(v) - sh));
    for (int64_t u = 0; u < n - i; ++u) {
      if (out) out[i + u] = e[u];
      sum[u] += e[u];
    }
  }
  return static_cast<float>(lane_sum<float>(sum));
}

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
