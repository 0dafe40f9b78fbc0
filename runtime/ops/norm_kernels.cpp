#include "lockstep/runtime/ops/norm_kernels.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "lockstep/runtime/cpu/simd.h"

namespace lockstep::runtime::norm_kernels {
namespace {

using cpu::kLanes;
using cpu::vec_t;

// Values summed in T before the partial sums are flushed to double: keeps f32
// rounding error bounded for long rows without slowing the inner loop.
constexpr int64_t kRun = 256;

// s1 += the sum of the first of pair(i), s2 += of the second, over [0, n):
// `lanes(i)` gives the pair for the kLanes values at i as vectors, `one(i)`
// for value i alone in double (the tail). Two vector accumulators per sum
// hide the add latency; runs of kRun values are flushed to double.
template <class T, class Lanes, class One>
void paired_sums(int64_t n, Lanes lanes, One one, double& s1_out, double& s2_out) {
  constexpr int L = kLanes<T>;
  double s1 = 0, s2 = 0;
  int64_t i = 0;
  while (i + 2 * L <= n) {
    vec_t<T> a0 = {}, a1 = {}, b0 = {}, b1 = {};
    const int64_t end = std::min(n, i + kRun) - 2 * L;
    for (; i <= end; i += 2 * L) {
      const auto [p0, q0] = lanes(i);
      const auto [p1, q1] = lanes(i + L);
      a0 += p0, a1 += p1;
      b0 += q0, b1 += q1;
    }
    s1 += cpu::lane_sum<T>(a0 + a1);
    s2 += cpu::lane_sum<T>(b0 + b1);
  }
  for (; i < n; ++i) {
    const auto [p, q] = one(i);
    s1 += p, s2 += q;
  }
  s1_out += s1, s2_out += s2;
}

template <class T>
using VecPair = std::pair<vec_t<T>, vec_t<T>>;

// s1 += sum(v - k), s2 += sum((v - k)^2).
template <class T>
void shifted_sums(const T* __restrict v, int64_t n, T k, double& s1, double& s2) {
  const vec_t<T> kk = cpu::splat(k);
  paired_sums<T>(
      n,
      [&](int64_t i) {
        const vec_t<T> d = cpu::load(v + i) - kk;
        return VecPair<T>{d, d * d};
      },
      [&](int64_t i) {
        const double d = static_cast<double>(v[i]) - k;
        return std::pair{d, d * d};
      },
      s1, s2);
}

// s1 += sum(gy), s2 += sum(gy * (x - m)).
template <class T>
void grad_sums(const T* __restrict gy, const T* __restrict x, int64_t n, T m, double& s1,
               double& s2) {
  const vec_t<T> mm = cpu::splat(m);
  paired_sums<T>(
      n,
      [&](int64_t i) {
        const vec_t<T> g = cpu::load(gy + i);
        return VecPair<T>{g, g * (cpu::load(x + i) - mm)};
      },
      [&](int64_t i) {
        const double g = gy[i];
        return std::pair{g, g * (static_cast<double>(x[i]) - m)};
      },
      s1, s2);
}

// A LayerNorm row's backward sums: s1 += sum(g), s2 += sum(g * (x a + k)),
// g = gy * w (gy alone without w), x a + k being the normalised x.
template <class T>
void row_grad_sums(const T* __restrict gy, const T* __restrict w, const T* __restrict x,
                   int64_t n, T a, T k, double& s1, double& s2) {
  const vec_t<T> aa = cpu::splat(a), kk = cpu::splat(k);
  paired_sums<T>(
      n,
      [&](int64_t i) {
        vec_t<T> g = cpu::load(gy + i);
        if (w) g *= cpu::load(w + i);
        return VecPair<T>{g, g * (cpu::load(x + i) * aa + kk)};
      },
      [&](int64_t i) {
        const double g = w ? static_cast<double>(gy[i]) * w[i] : gy[i];
        return std::pair{g, g * (x[i] * a + k)};
      },
      s1, s2);
}

template <class T>
void affine_run(const T* __restrict x, int64_t n, T a, T b, T* __restrict y) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int u = 0; u < 8; ++u) y[i + u] = x[i + u] * a + b;
  for (; i < n; ++i) y[i] = x[i] * a + b;
}

template <class T>
void grad_input_run(const T* __restrict gy, const T* __restrict x, int64_t n, T a, T b, T k,
                    T* __restrict gx) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int u = 0; u < 8; ++u) gx[i + u] = gy[i + u] * a + x[i + u] * b + k;
  for (; i < n; ++i) gx[i] = gy[i] * a + x[i] * b + k;
}

}  // namespace

template <class T>
void channel_stats(const ChannelShape& s, const T* x, double* mean, double* var) {
  const double count = static_cast<double>(s.count());
  std::vector<double> s1(s.c, 0.0), s2(s.c, 0.0), shift(s.c, 0.0);
  if (s.count() == 0) {
    std::fill(mean, mean + s.c, 0.0);
    std::fill(var, var + s.c, 0.0);
    return;
  }
  if (s.inner == 1) {
    // [N, C]: walk rows, all channels at once.
    for (int64_t c = 0; c < s.c; ++c) shift[c] = x[c];
    for (int64_t n = 0; n < s.n; ++n) {
      const T* row = x + n * s.c;
      for (int64_t c = 0; c < s.c; ++c) {
        const double d = static_cast<double>(row[c]) - shift[c];
        s1[c] += d;
        s2[c] += d * d;
      }
    }
  } else {
    for (int64_t c = 0; c < s.c; ++c) {
      const T k = x[c * s.inner];
      shift[c] = k;
      for (int64_t n = 0; n < s.n; ++n)
        shifted_sums(x + (n * s.c + c) * s.inner, s.inner, k, s1[c], s2[c]);
    }
  }
  for (int64_t c = 0; c < s.c; ++c) {
    const double m = s1[c] / count;
    mean[c] = shift[c] + m;
    var[c] = std::max(s2[c] / count - m * m, 0.0);
  }
}

template <class T>
void channel_affine(const ChannelShape& s, const T* x, const T* scale, const T* shift, T* y) {
  for (int64_t n = 0; n < s.n; ++n) {
    if (s.inner == 1) {
      const T* row = x + n * s.c;
      T* out = y + n * s.c;
      for (int64_t c = 0; c < s.c; ++c) out[c] = row[c] * scale[c] + shift[c];
      continue;
    }
    for (int64_t c = 0; c < s.c; ++c) {
      const int64_t off = (n * s.c + c) * s.inner;
      affine_run(x + off, s.inner, scale[c], shift[c], y + off);
    }
  }
}

template <class T>
void channel_grad_sums(const ChannelShape& s, const T* gy, const T* x, const double* mean,
                       double* sum_gy, double* sum_gy_xc) {
  std::fill(sum_gy, sum_gy + s.c, 0.0);
  std::fill(sum_gy_xc, sum_gy_xc + s.c, 0.0);
  if (s.inner == 1) {
    for (int64_t n = 0; n < s.n; ++n) {
      for (int64_t c = 0; c < s.c; ++c) {
        const double g = gy[n * s.c + c];
        sum_gy[c] += g;
        sum_gy_xc[c] += g * (static_cast<double>(x[n * s.c + c]) - mean[c]);
      }
    }
    return;
  }
  for (int64_t c = 0; c < s.c; ++c) {
    const T m = static_cast<T>(mean[c]);
    for (int64_t n = 0; n < s.n; ++n) {
      const int64_t off = (n * s.c + c) * s.inner;
      grad_sums(gy + off, x + off, s.inner, m, sum_gy[c], sum_gy_xc[c]);
    }
  }
}

template <class T>
void channel_grad_input(const ChannelShape& s, const T* gy, const T* x, const T* a, const T* b,
                        const T* k, T* gx) {
  for (int64_t n = 0; n < s.n; ++n) {
    if (s.inner == 1) {
      for (int64_t c = 0; c < s.c; ++c) {
        const int64_t i = n * s.c + c;
        gx[i] = gy[i] * a[c] + x[i] * b[c] + k[c];
      }
      continue;
    }
    for (int64_t c = 0; c < s.c; ++c) {
      const int64_t off = (n * s.c + c) * s.inner;
      grad_input_run(gy + off, x + off, s.inner, a[c], b[c], k[c], gx + off);
    }
  }
}

template <class T>
void layer_norm_forward(int64_t rows, int64_t d, const T* x, const T* w, const T* b, double eps,
                        T* y, double* mean, double* invstd) {
  if (d == 0) {
    std::fill(mean, mean + rows, 0.0);
    std::fill(invstd, invstd + rows, 1.0 / std::sqrt(eps));
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    T* yr = y + r * d;
    // Two passes over a row that sits in cache: shift by the first value,
    // then the exact mean.
    double s1 = 0, s2 = 0;
    shifted_sums(xr, d, xr[0], s1, s2);
    const double m = xr[0] + s1 / d;
    double t1 = 0, t2 = 0;
    shifted_sums(xr, d, static_cast<T>(m), t1, t2);
    const double var = std::max(t2 / d - (t1 / d) * (t1 / d), 0.0);
    const double is = 1.0 / std::sqrt(var + eps);
    mean[r] = m;
    invstd[r] = is;
    // k from the rounded a and mean, as PyTorch's -rstd * mean: x equal to
    // the mean (a constant row) then normalises to exactly 0.
    const T a = static_cast<T>(is), k = -(a * static_cast<T>(m));
    if (w == nullptr && b == nullptr) {
      affine_run(xr, d, a, k, yr);
    } else {
      for (int64_t i = 0; i < d; ++i) {
        const T xhat = xr[i] * a + k;
        yr[i] = (w ? xhat * w[i] : xhat) + (b ? b[i] : T(0));
      }
    }
  }
}

template <class T>
void layer_norm_backward(int64_t rows, int64_t d, const T* gy, const T* x, const T* w,
                         const double* mean, const double* invstd, T* grad_x, T* grad_w,
                         T* grad_b) {
  std::vector<double> gw_acc(grad_w ? d : 0, 0.0), gb_acc(grad_b ? d : 0, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const T* gr = gy + r * d;
    const T* xr = x + r * d;
    const T is = static_cast<T>(invstd[r]), k = -(is * static_cast<T>(mean[r]));  // as forward
    if (grad_w || grad_b) {
      for (int64_t i = 0; i < d; ++i) {
        if (grad_w) gw_acc[i] += static_cast<double>(gr[i]) * (xr[i] * is + k);
        if (grad_b) gb_acc[i] += gr[i];
      }
    }
    if (grad_x == nullptr) continue;
    // g = gy * w; grad_x = invstd * (g - mean(g) - xhat * mean(g * xhat)).
    double sg = 0, sgx = 0;
    row_grad_sums(gr, w, xr, d, is, k, sg, sgx);
    const T mg = static_cast<T>(sg / d), mgx = static_cast<T>(sgx / d);
    T* gxr = grad_x + r * d;
    for (int64_t i = 0; i < d; ++i) {
      const T g = w ? gr[i] * w[i] : gr[i];
      gxr[i] = is * (g - mg - (xr[i] * is + k) * mgx);
    }
  }
  for (int64_t i = 0; grad_w && i < d; ++i) grad_w[i] = static_cast<T>(gw_acc[i]);
  for (int64_t i = 0; grad_b && i < d; ++i) grad_b[i] = static_cast<T>(gb_acc[i]);
}

#define LOCKSTEP_INSTANTIATE(T)                                                               \
  template void channel_stats<T>(const ChannelShape&, const T*, double*, double*);            \
  template void channel_affine<T>(const ChannelShape&, const T*, const T*, const T*, T*);     \
  template void channel_grad_sums<T>(const ChannelShape&, const T*, const T*, const double*,  \
                                     double*, double*);                                       \
  template void channel_grad_input<T>(const ChannelShape&, const T*, const T*, const T*,      \
                                      const T*, const T*, T*);                                \
  template void layer_norm_forward<T>(int64_t, int64_t, const T*, const T*, const T*, double, \
                                      T*, double*, double*);                                  \
  template void layer_norm_backward<T>(int64_t, int64_t, const T*, const T*, const T*,        \
                                       const double*, const double*, T*, T*, T*);
LOCKSTEP_INSTANTIATE(float)
LOCKSTEP_INSTANTIATE(double)
#undef LOCKSTEP_INSTANTIATE

}  // namespace lockstep::runtime::norm_kernels
