// Pooling loops. Every kernel walks one [h, w] plane at a time; windows are
// clipped to the image (max pooling never sees the padding, average pooling
// counts it in the divisor).
#include "lockstep/runtime/ops/pool_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "lockstep/runtime/cpu/simd.h"

namespace lockstep::runtime::pool_kernels {
namespace {

// NaN propagates: once a NaN is seen it is the maximum, as in PyTorch.
template <class T>
inline bool takes_over(T v, T best) {
  return v > best || std::isnan(v);
}

// The common 2x2, stride-2, unpadded case. With random data the comparisons
// are coin flips, so a compare-and-branch loop mispredicts about half the time
// (most of its run time). Here the maximum is a tree of `b > a ? b : a`
// (maxss/maxps; of equal values, the first) and the tap is the first one
// equal to it, computed with integer arithmetic: no data-dependent branch
// except the rare NaN window, which takes the generic rule (NaN wins).
//
// f32 rows go four outputs at a time in vector registers (the even and odd
// columns of each input row split apart by shuffles); a row's last ow % 4
// outputs go in a last group that overlaps the one before (its outputs are
// computed twice, to the same values), and rows under 4 outputs, and the rest
// of a row from a group with a NaN in it, take the scalar loop.
using f32x4 = cpu::vec_t<float>;
using i32x4 = int32_t __attribute__((vector_size(16)));

// Outputs [0, ow_n) of one row rounded down to whole groups of 4; returns
// the first output left to the scalar loop.
int64_t max_pool_2x2_f32_groups(const float* r0, const float* r1, int64_t ow_n,
                                int32_t row_base, int32_t w, float* yr, int32_t* ir) {
  // even: the shuffle picking columns 0, 2, 4, 6, and so each lane's column offset.
  const i32x4 even = {0, 2, 4, 6}, odd = {1, 3, 5, 7};
  int64_t ow = 0;
  for (; ow < ow_n; ow += 4) {
    if (ow + 4 > ow_n) {
      if (ow_n < 4) return ow;
      ow = ow_n - 4;  // the overlapping last group
    }
    const f32x4 t0 = cpu::load(r0 + 2 * ow), t1 = cpu::load(r0 + 2 * ow + 4);
    const f32x4 b0 = cpu::load(r1 + 2 * ow), b1 = cpu::load(r1 + 2 * ow + 4);
    const f32x4 v0 = __builtin_shuffle(t0, t1, even), v1 = __builtin_shuffle(t0, t1, odd);
    const f32x4 v2 = __builtin_shuffle(b0, b1, even), v3 = __builtin_shuffle(b0, b1, odd);
    const i32x4 nan = (v0 != v0) | (v1 != v1) | (v2 != v2) | (v3 != v3);
    if (nan[0] | nan[1] | nan[2] | nan[3]) return ow;
    const f32x4 m01 = v1 > v0 ? v1 : v0, m23 = v3 > v2 ? v3 : v2;
    const f32x4 best = m23 > m01 ? m23 : m01;
    // Comparisons give -1 (true) or 0: tap = first k with v_k == best.
    const i32x4 one = {1, 1, 1, 1};
    const i32x4 tap = (v0 != best) & (one + ((v1 != best) & (one + ((v2 != best) & one))));
    cpu::store(yr + ow, best);
    const i32x4 at = row_base + 2 * static_cast<int32_t>(ow) + even + (tap & one) +
                     (-(tap >> 1) & w);
    std::memcpy(ir + ow, &at, sizeof at);
  }
  return ow;
}

template <class T>
void max_pool_2x2(const PoolShape& s, const T* x, T* y, int32_t* argmax) {
  const int64_t plane_in = s.h * s.w, plane_out = s.oh * s.ow;
  // Keeps a unless b is larger, so that of equal values (0.0 and -0.0) the
  // first one is the maximum, the value at the tap the gradient goes to.
  auto max2 = [](T a, T b) { return b > a ? b : a; };
  for (int64_t pl = 0; pl < s.planes; ++pl) {
    const T* xp = x + pl * plane_in;
    for (int64_t oh = 0; oh < s.oh; ++oh) {
      const int64_t base = 2 * oh * s.w;
      const T* __restrict r0 = xp + base;
      const T* __restrict r1 = r0 + s.w;
      T* __restrict yr = y + pl * plane_out + oh * s.ow;
      int32_t* __restrict ir = argmax + pl * plane_out + oh * s.ow;
      const int32_t row_base = static_cast<int32_t>(base), w = static_cast<int32_t>(s.w);
      int64_t ow = 0;
      if constexpr (std::is_same_v<T, float>)
        ow = max_pool_2x2_f32_groups(r0, r1, s.ow, row_base, w, yr, ir);
      for (; ow < s.ow; ++ow) {
        const T v[4] = {r0[2 * ow], r0[2 * ow + 1], r1[2 * ow], r1[2 * ow + 1]};
        T best = max2(max2(v[0], v[1]), max2(v[2], v[3]));
        int32_t tap = (v[0] != best) * (1 + (v[1] != best) * (1 + (v[2] != best)));
        if ((v[0] != v[0]) | (v[1] != v[1]) | (v[2] != v[2]) | (v[3] != v[3])) {
          best = v[0], tap = 0;
          for (int32_t k = 1; k < 4; ++k)
            if (takes_over(v[k], best)) best = v[k], tap = k;
        }
        yr[ow] = best;
        ir[ow] = row_base + 2 * static_cast<int32_t>(ow) + (tap & 1) + (tap >> 1) * w;
      }
    }
  }
}

// Window [start, end) of output index o along one axis, clipped to [0, size).
inline void window(int64_t o, int64_t stride, int64_t pad, int64_t k, int64_t size,
                   int64_t& start, int64_t& end) {
  start = o * stride - pad;
  end = std::min(start + k, size);
  start = std::max<int64_t>(start, 0);
}

}  // namespace

template <class T>
void max_pool_forward(const PoolShape& s, const T* x, T* y, int32_t* argmax) {
  // Only whole windows (a ceil_mode output can end in a clipped one).
  if (s.kh == 2 && s.kw == 2 && s.sh == 2 && s.sw == 2 && s.ph == 0 && s.pw == 0 &&
      2 * s.oh <= s.h && 2 * s.ow <= s.w)
    return max_pool_2x2(s, x, y, argmax);
  const int64_t plane_in = s.h * s.w, plane_out = s.oh * s.ow;
  for (int64_t pl = 0; pl < s.planes; ++pl) {
    const T* xp = x + pl * plane_in;
    T* yp = y + pl * plane_out;
    int32_t* ip = argmax + pl * plane_out;
    for (int64_t oh = 0; oh < s.oh; ++oh) {
      int64_t hs, he;
      window(oh, s.sh, s.ph, s.kh, s.h, hs, he);
      for (int64_t ow = 0; ow < s.ow; ++ow) {
        int64_t ws, we;
        window(ow, s.sw, s.pw, s.kw, s.w, ws, we);
        // padding <= kernel / 2 (checked by the caller) keeps every window non-empty.
        int64_t at = hs * s.w + ws;
        T best = xp[at];
        for (int64_t ih = hs; ih < he; ++ih) {
          for (int64_t iw = ws; iw < we; ++iw) {
            const T v = xp[ih * s.w + iw];
            if (takes_over(v, best)) best = v, at = ih * s.w + iw;
          }
        }
        yp[oh * s.ow + ow] = best;
        ip[oh * s.ow + ow] = static_cast<int32_t>(at);
      }
    }
  }
}

template <class T>
void max_pool_backward(const PoolShape& s, const T* grad_y, const int32_t* argmax, T* grad_x) {
  const int64_t plane_in = s.h * s.w, plane_out = s.oh * s.ow;
  std::fill(grad_x, grad_x + s.planes * plane_in, T(0));
  for (int64_t pl = 0; pl < s.planes; ++pl) {
    T* gx = grad_x + pl * plane_in;
    const T* gy = grad_y + pl * plane_out;
    const int32_t* ip = argmax + pl * plane_out;
    for (int64_t q = 0; q < plane_out; ++q) gx[ip[q]] += gy[q];
  }
}

// Divisor of a count_include_pad window: its extent clipped to the padded
// image, before clipping to the image itself.
template <class T>
void avg_pool_forward(const PoolShape& s, const T* x, T* y) {
  const int64_t plane_in = s.h * s.w, plane_out = s.oh * s.ow;
  for (int64_t pl = 0; pl < s.planes; ++pl) {
    const T* xp = x + pl * plane_in;
    T* yp = y + pl * plane_out;
    for (int64_t oh = 0; oh < s.oh; ++oh) {
      const int64_t h0 = oh * s.sh - s.ph, h1 = std::min(h0 + s.kh, s.h + s.ph);
      const int64_t hs = std::max<int64_t>(h0, 0), he = std::min(h1, s.h);
      for (int64_t ow = 0; ow < s.ow; ++ow) {
        const int64_t w0 = ow * s.sw - s.pw, w1 = std::min(w0 + s.kw, s.w + s.pw);
        const int64_t ws = std::max<int64_t>(w0, 0), we = std::min(w1, s.w);
        T sum = 0;
        for (int64_t ih = hs; ih < he; ++ih)
          for (int64_t iw = ws; iw < we; ++iw) sum += xp[ih * s.w + iw];
        yp[oh * s.ow + ow] = sum / static_cast<T>((h1 - h0) * (w1 - w0));
      }
    }
  }
}

template <class T>
void avg_pool_backward(const PoolShape& s, const T* grad_y, T* grad_x) {
  const int64_t plane_in = s.h * s.w, plane_out = s.oh * s.ow;
  std::fill(grad_x, grad_x + s.planes * plane_in, T(0));
  for (int64_t pl = 0; pl < s.planes; ++pl) {
    T* gx = grad_x + pl * plane_in;
    const T* gy = grad_y + pl * plane_out;
    for (int64_t oh = 0; oh < s.oh; ++oh) {
      const int64_t h0 = oh * s.sh - s.ph, h1 = std::min(h0 + s.kh, s.h + s.ph);
      const int64_t hs = std::max<int64_t>(h0, 0), he = std::min(h1, s.h);
      for (int64_t ow = 0; ow < s.ow; ++ow) {
        const int64_t w0 = ow * s.sw - s.pw, w1 = std::min(w0 + s.kw, s.w + s.pw);
        const int64_t ws = std::max<int64_t>(w0, 0), we = std::min(w1, s.w);
        const T g = gy[oh * s.ow + ow] / static_cast<T>((h1 - h0) * (w1 - w0));
        for (int64_t ih = hs; ih < he; ++ih)
          for (int64_t iw = ws; iw < we; ++iw) gx[ih * s.w + iw] += g;
      }
    }
  }
}

namespace {
inline int64_t adaptive_start(int64_t o, int64_t in, int64_t out) { return (o * in) / out; }
inline int64_t adaptive_end(int64_t o, int64_t in, int64_t out) {
  return ((o + 1) * in + out - 1) / out;
}
}  // namespace

template <class T>
void adaptive_avg_pool_forward(const PoolShape& s, const T* x, T* y) {
  const int64_t plane_in = s.h * s.w, plane_out = s.oh * s.ow;
  for (int64_t pl = 0; pl < s.planes; ++pl) {
    const T* xp = x + pl * plane_in;
    T* yp = y + pl * plane_out;
    for (int64_t oh = 0; oh < s.oh; ++oh) {
      const int64_t hs = adaptive_start(oh, s.h, s.oh), he = adaptive_end(oh, s.h, s.oh);
      for (int64_t ow = 0; ow < s.ow; ++ow) {
        const int64_t ws = adaptive_start(ow, s.w, s.ow), we = adaptive_end(ow, s.w, s.ow);
        T sum = 0;
        for (int64_t ih = hs; ih < he; ++ih)
          for (int64_t iw = ws; iw < we; ++iw) sum += xp[ih * s.w + iw];
        yp[oh * s.ow + ow] = sum / static_cast<T>((he - hs) * (we - ws));
      }
    }
  }
}

template <class T>
void adaptive_avg_pool_backward(const PoolShape& s, const T* grad_y, T* grad_x) {
  const int64_t plane_in = s.h * s.w, plane_out = s.oh * s.ow;
  std::fill(grad_x, grad_x + s.planes * plane_in, T(0));
  for (int64_t pl = 0; pl < s.planes; ++pl) {
    T* gx = grad_x + pl * plane_in;
    const T* gy = grad_y + pl * plane_out;
    for (int64_t oh = 0; oh < s.oh; ++oh) {
      const int64_t hs = adaptive_start(oh, s.h, s.oh), he = adaptive_end(oh, s.h, s.oh);
      for (int64_t ow = 0; ow < s.ow; ++ow) {
        const int64_t ws = adaptive_start(ow, s.w, s.ow), we = adaptive_end(ow, s.w, s.ow);
        const T g = gy[oh * s.ow + ow] / static_cast<T>((he - hs) * (we - ws));
        for (int64_t ih = hs; ih < he; ++ih)
          for (int64_t iw = ws; iw < we; ++iw) gx[ih * s.w + iw] += g;
      }
    }
  }
}

#define LOCKSTEP_INSTANTIATE(T)                                                            \
  template void max_pool_forward<T>(const PoolShape&, const T*, T*, int32_t*);             \
  template void max_pool_backward<T>(const PoolShape&, const T*, const int32_t*, T*);      \
  template void avg_pool_forward<T>(const PoolShape&, const T*, T*);                       \
  template void avg_pool_backward<T>(const PoolShape&, const T*, T*);                      \
  template void adaptive_avg_pool_forward<T>(const PoolShape&, const T*, T*);              \
  template void adaptive_avg_pool_backward<T>(const PoolShape&, const T*, T*);
LOCKSTEP_INSTANTIATE(float)
LOCKSTEP_INSTANTIATE(double)
#undef LOCKSTEP_INSTANTIATE

}  // namespace lockstep::runtime::pool_kernels
