// Softmax, log-softmax and cross-entropy (see softmax_loss.h).
//
// A row's softmax needs its maximum m and s = sum exp(x - m). Each thread
// keeps (m, s) for its elements online (a larger element rescales s), the
// pairs are merged across the warp or block, and a second pass over the row
// writes the result. When the softmax dimension is not the last one, a
// thread walks one (outer, inner) column instead, neighbouring threads
// reading neighbouring addresses.
#include "lockstep/runtime/cuda/kernels/softmax_loss.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "lockstep/runtime/cuda/kernels/block_reduce.cuh"
#include "lockstep/runtime/cuda/kernels/device_types.cuh"

namespace lockstep::runtime::cuda::kernels {
namespace {

constexpr int64_t kWarpRowLimit = 1024;  // longer rows get a block each
constexpr int64_t kMaxGrid = int64_t{1} << 20;

__device__ __forceinline__ float exp_c(float x) { return expf(x); }
__device__ __forceinline__ double exp_c(double x) { return exp(x); }
__device__ __forceinline__ float log_c(float x) { return logf(x); }
__device__ __forceinline__ double log_c(double x) { return log(x); }

template <class C>
struct MaxSum {
  C m;  // largest element seen (-inf: none)
  C s;  // sum of exp(x - m) over the elements seen
};

template <class C>
__device__ __forceinline__ MaxSum<C> max_sum_identity() {
  return {C(-INFINITY), C(0)};
}

// Adds one element. -inf elements add nothing (exp(-inf - m) = 0), also when
// m is still -inf, where exp(x - m) would be NaN. A NaN element becomes m, so
// that it is kept whatever comes after (s turns NaN too), as on the CPU.
template <class C>
__device__ __forceinline__ void max_sum_add(MaxSum<C>& st, C x) {
  if (x > st.m || x != x) {
    st.s = (st.m == C(-INFINITY) ? C(0) : st.s * exp_c(st.m - x)) + C(1);
    st.m = x;
  } else if (x != C(-INFINITY)) {
    st.s += exp_c(x - st.m);
  }
}

struct MaxSumCombine {
  template <class C>
  __device__ MaxSum<C> operator()(MaxSum<C> a, MaxSum<C> b) const {
    if (a.m != a.m) return a;  // a NaN seen on either side wins
    if (b.m != b.m) return b;
    if (a.m < b.m) {
      const MaxSum<C> t = a;
      a = b;
      b = t;
    }
    if (b.m == C(-INFINITY)) return a;  // b is empty (or all -inf)
    return {a.m, a.s + b.s * exp_c(b.m - a.m)};
  }
};

struct Add {
  template <class C>
  __device__ C operator()(C a, C b) const { return a + b; }
};

// Which rows a thread works on, and its place among the row's threads: a warp
// per row (blockDim (32, 8)) or the whole block per row.
struct RowMapping {
  int64_t first, step;
  int t, nt;
  __device__ explicit RowMapping(bool block_per_row) {
    if (block_per_row) {
      first = blockIdx.x;
      step = gridDim.x;
      t = threadIdx.x + threadIdx.y * blockDim.x;
      nt = blockDim.x * blockDim.y;
    } else {
      first = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
      step = static_cast<int64_t>(gridDim.x) * blockDim.y;
      t = threadIdx.x;
      nt = 32;
    }
  }
};

// Every thread of the row's group gets the combination of their values.
template <class T, class F>
__device__ __forceinline__ T row_allreduce(T v, F f, T identity, T* smem, bool block_per_row) {
  return block_per_row ? block_allreduce(v, f, identity, smem) : warp_allreduce(v, f);
}

template <class T, int Vec, bool Log>
__global__ void __launch_bounds__(256)
    softmax_forward_rows(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t n,
                         bool block_per_row) {
  using C = compute_t<T>;
  __shared__ MaxSum<C> smem[33];
  const RowMapping rm(block_per_row);
  const int64_t packs = n / Vec;
  for (int64_t r = rm.first; r < rows; r += rm.step) {  // uniform per row group
    const T* xr = x + r * n;
    T* yr = y + r * n;
    MaxSum<C> st = max_sum_identity<C>();
    for (int64_t k = rm.t; k < packs; k += rm.nt) {
      const AlignedVec<T, Vec> v = load_vec<Vec>(xr, k);
#pragma unroll
      for (int q = 0; q < Vec; ++q) max_sum_add(st, convert<C>(v.v[q]));
    }
    st = row_allreduce(st, MaxSumCombine{}, max_sum_identity<C>(), smem, block_per_row);
    const C lse = st.m + log_c(st.s);
    for (int64_t k = rm.t; k < packs; k += rm.nt) {
      const AlignedVec<T, Vec> v = load_vec<Vec>(xr, k);
      AlignedVec<T, Vec> o;
#pragma unroll
      for (int q = 0; q < Vec; ++q) {
        const C xv = convert<C>(v.v[q]);
        o.v[q] = convert<T>(Log ? xv - lse : exp_c(xv - st.m) / st.s);
      }
      store_vec<Vec>(yr, k, o);
    }
  }
}

template <class T, bool Log>
__global__ void __launch_bounds__(256)
    softmax_forward_strided(const T* __restrict__ x, T* __restrict__ y, SoftmaxShape s) {
  using C = compute_t<T>;
  const int64_t cols = s.outer * s.inner;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols;
       c += step) {
    const int64_t o = c / s.inner, i = c - o * s.inner;
    const T* xc = x + o * s.n * s.inner + i;
    T* yc = y + o * s.n * s.inner + i;
    MaxSum<C> st = max_sum_identity<C>();
    for (int64_t j = 0; j < s.n; ++j) max_sum_add(st, convert<C>(xc[j * s.inner]));
    const C lse = st.m + log_c(st.s);
    for (int64_t j = 0; j < s.n; ++j) {
      const C xv = convert<C>(xc[j * s.inner]);
      yc[j * s.inner] = convert<T>(Log ? xv - lse : exp_c(xv - st.m) / st.s);
    }
  }
}

template <class T, int Vec, bool Log>
__global__ void __launch_bounds__(256)
    softmax_backward_rows(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                          int64_t rows, int64_t n, bool block_per_row) {
  using C = compute_t<T>;
  __shared__ C smem[33];
  const RowMapping rm(block_per_row);
  const int64_t packs = n / Vec;
  for (int64_t r = rm.first; r < rows; r += rm.step) {
    const T* yr = y + r * n;
    const T* gr = dy + r * n;
    T* xr = dx + r * n;
    C dot = C(0);  // sum(dy) for log_softmax, sum(dy * y) for softmax
    for (int64_t k = rm.t; k < packs; k += rm.nt) {
      const AlignedVec<T, Vec> g = load_vec<Vec>(gr, k);
      if constexpr (Log) {
#pragma unroll
        for (int q = 0; q < Vec; ++q) dot += convert<C>(g.v[q]);
      } else {
        const AlignedVec<T, Vec> yv = load_vec<Vec>(yr, k);
#pragma unroll
        for (int q = 0; q < Vec; ++q) dot += convert<C>(g.v[q]) * convert<C>(yv.v[q]);
      }
    }
    dot = row_allreduce(dot, Add{}, C(0), smem, block_per_row);
    for (int64_t k = rm.t; k < packs; k += rm.nt) {
      const AlignedVec<T, Vec> g = load_vec<Vec>(gr, k);
      const AlignedVec<T, Vec> yv = load_vec<Vec>(yr, k);
      AlignedVec<T, Vec> o;
#pragma unroll
      for (int q = 0; q < Vec; ++q) {
        const C gq = convert<C>(g.v[q]), yq = convert<C>(yv.v[q]);
        o.v[q] = convert<T>(Log ? gq - exp_c(yq) * dot : yq * (gq - dot));
      }
      store_vec<Vec>(xr, k, o);
    }
  }
}

template <class T, bool Log>
__global__ void __launch_bounds__(256)
    softmax_backward_strided(const T* __restrict__ y, const T* __restrict__ dy,
                             T* __restrict__ dx, SoftmaxShape s) {
  using C = compute_t<T>;
  const int64_t cols = s.outer * s.inner;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols;
       c += step) {
    const int64_t o = c / s.inner, i = c - o * s.inner;
    const int64_t base = o * s.n * s.inner + i;
    C dot = C(0);
    for (int64_t j = 0; j < s.n; ++j) {
      const C g = convert<C>(dy[base + j * s.inner]);
      dot += Log ? g : g * convert<C>(y[base + j * s.inner]);
    }
    for (int64_t j = 0; j < s.n; ++j) {
      const int64_t e = base + j * s.inner;
      const C g = convert<C>(dy[e]), yv = convert<C>(y[e]);
      dx[e] = convert<T>(Log ? g - exp_c(yv) * dot : yv * (g - dot));
    }
  }
}

// Running (max, sum of exp) plus the plain sum of the logits (label smoothing).
template <class C>
struct CrossEntropyAcc {
  MaxSum<C> ms;
  C sum_x;
};

struct CrossEntropyCombine {
  template <class C>
  __device__ CrossEntropyAcc<C> operator()(CrossEntropyAcc<C> a, CrossEntropyAcc<C> b) const {
    return {MaxSumCombine{}(a.ms, b.ms), a.sum_x + b.sum_x};
  }
};

template <class T, class L, int Vec>
__global__ void __launch_bounds__(256)
    cross_entropy_forward_rows(const CrossEntropyArgs a, L* __restrict__ loss,
                               compute_t<T>* __restrict__ lse_out, bool block_per_row) {
  using C = compute_t<T>;
  using Acc = CrossEntropyAcc<C>;
  __shared__ Acc smem[33];
  const T* x = static_cast<const T*>(a.logits);
  const RowMapping rm(block_per_row);
  const int64_t packs = a.c / Vec;
  const Acc identity{max_sum_identity<C>(), C(0)};
  for (int64_t r = rm.first; r < a.n; r += rm.step) {
    const T* xr = x + r * a.c;
    Acc acc = identity;
    for (int64_t k = rm.t; k < packs; k += rm.nt) {
      const AlignedVec<T, Vec> v = load_vec<Vec>(xr, k);
#pragma unroll
      for (int q = 0; q < Vec; ++q) {
        const C xv = convert<C>(v.v[q]);
        max_sum_add(acc.ms, xv);
        acc.sum_x += xv;
      }
    }
    acc = row_allreduce(acc, CrossEntropyCombine{}, identity, smem, block_per_row);
    if (rm.t == 0) {
      const C lse = acc.ms.m + log_c(acc.ms.s);
      const int64_t target = a.target[r];
      C l = C(NAN);
      if (a.ignores && target == a.ignore_index) {
        l = C(0);
      } else if (target >= 0 && target < a.c) {
        const C s = static_cast<C>(a.smoothing);
        const C nll = lse - convert<C>(xr[target]);
        const C smooth = lse - acc.sum_x / static_cast<C>(a.c);  // mean of -log p over classes
        // Without smoothing, a -inf logit (an infinite smooth) must not give 0 * inf.
        l = s > C(0) ? (C(1) - s) * nll + s * smooth : nll;
      }
      loss[r] = convert<L>(l);
      lse_out[r] = lse;
    }
  }
}

// Flat over the n * c gradient elements, Vec at a time (c % Vec == 0, so a
// pack never straddles two rows).
template <class T, int Vec>
__global__ void __launch_bounds__(256)
    cross_entropy_backward_flat(const CrossEntropyArgs a, const compute_t<T>* __restrict__ lse,
                                const T* __restrict__ grad, bool per_row, compute_t<T> divisor,
                                T* __restrict__ grad_logits) {
  using C = compute_t<T>;
  const T* x = static_cast<const T*>(a.logits);
  const C s = static_cast<C>(a.smoothing);
  const C off = s / static_cast<C>(a.c);
  const int64_t packs = a.n * a.c / Vec;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < packs;
       k += step) {
    const int64_t first = k * Vec;
    const int64_t r = first / a.c, j0 = first - r * a.c;
    const int64_t target = a.target[r];
    const bool valid = target >= 0 && target < a.c;
    const bool ignored = a.ignores && target == a.ignore_index;
    const C w = convert<C>(grad[per_row ? r : 0]) / divisor;
    const C l = lse[r];
    const AlignedVec<T, Vec> v = load_vec<Vec>(x, k);
    AlignedVec<T, Vec> o;
#pragma unroll
    for (int q = 0; q < Vec; ++q) {
      C g = w * (exp_c(convert<C>(v.v[q]) - l) - off);
      if (j0 + q == target) g -= w * (C(1) - s);
      o.v[q] = convert<T>(ignored ? C(0) : valid ? g : C(NAN));
    }
    store_vec<Vec>(grad_logits, k, o);
  }
}

// Threads per block and blocks for `rows` rows of `n` elements.
struct RowLaunch {
  bool block_per_row;
  unsigned blocks;
};

RowLaunch row_launch(int64_t rows, int64_t n) {
  const bool block = n > kWarpRowLimit;
  const int64_t blocks = block ? rows : (rows + 7) / 8;
  return {block, static_cast<unsigned>(std::min(std::max<int64_t>(blocks, 1), kMaxGrid))};
}

template <class T, bool Log>
cudaError_t launch_forward(const T* x, T* y, const SoftmaxShape& s, cudaStream_t stream) {
  if (s.inner == 1) {
    const RowLaunch rl = row_launch(s.outer, s.n);
    constexpr int kVec = vec16_v<T>;
    if (s.n % kVec == 0 && aligned16({x, y}))
      softmax_forward_rows<T, kVec, Log><<<rl.blocks, dim3(32, 8), 0, stream>>>(
          x, y, s.outer, s.n, rl.block_per_row);
    else
      softmax_forward_rows<T, 1, Log><<<rl.blocks, dim3(32, 8), 0, stream>>>(x, y, s.outer, s.n,
                                                                            rl.block_per_row);
  } else {
    softmax_forward_strided<T, Log><<<grid_for(s.outer * s.inner), kBlock, 0, stream>>>(x, y, s);
  }
  return cudaGetLastError();
}

template <class T, bool Log>
cudaError_t launch_backward(const T* y, const T* dy, T* dx, const SoftmaxShape& s,
                            cudaStream_t stream) {
  if (s.inner == 1) {
    const RowLaunch rl = row_launch(s.outer, s.n);
    constexpr int kVec = vec16_v<T>;
    if (s.n % kVec == 0 && aligned16({y, dy, dx}))
      softmax_backward_rows<T, kVec, Log><<<rl.blocks, dim3(32, 8), 0, stream>>>(
          y, dy, dx, s.outer, s.n, rl.block_per_row);
    else
      softmax_backward_rows<T, 1, Log><<<rl.blocks, dim3(32, 8), 0, stream>>>(
          y, dy, dx, s.outer, s.n, rl.block_per_row);
  } else {
    softmax_backward_strided<T, Log><<<grid_for(s.outer * s.inner), kBlock, 0, stream>>>(y, dy,
                                                                                        dx, s);
  }
  return cudaGetLastError();
}

bool empty(const SoftmaxShape& s) { return s.outer == 0 || s.n == 0 || s.inner == 0; }

}  // namespace

cudaError_t softmax_forward(ScalarType dtype, bool log, const void* x, void* y,
                            const SoftmaxShape& s, cudaStream_t stream) {
  if (empty(s)) return cudaSuccess;
  return dispatch_float_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x);
    T* yp = static_cast<T*>(y);
    return log ? launch_forward<T, true>(xp, yp, s, stream)
               : launch_forward<T, false>(xp, yp, s, stream);
  });
}

cudaError_t softmax_backward(ScalarType dtype, bool log, const void* y, const void* dy, void* dx,
                             const SoftmaxShape& s, cudaStream_t stream) {
  if (empty(s)) return cudaSuccess;
  return dispatch_float_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* yp = static_cast<const T*>(y);
    const T* gp = static_cast<const T*>(dy);
    T* xp = static_cast<T*>(dx);
    return log ? launch_backward<T, true>(yp, gp, xp, s, stream)
               : launch_backward<T, false>(yp, gp, xp, s, stream);
  });
}

cudaError_t cross_entropy_forward(const CrossEntropyArgs& a, void* loss, ScalarType loss_dtype,
                                  void* lse, cudaStream_t stream) {
  if (a.n == 0) return cudaSuccess;
  if (a.c == 0) return cudaErrorInvalidValue;
  return dispatch_float_type(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const RowLaunch rl = row_launch(a.n, a.c);
    constexpr int kVec = vec16_v<T>;
    const bool vec = a.c % kVec == 0 && aligned16({a.logits});
    auto run = [&](auto loss_tag) {
      using L = decltype(loss_tag);
      L* lp = static_cast<L*>(loss);
      C* sp = static_cast<C*>(lse);
      if (vec)
        cross_entropy_forward_rows<T, L, kVec><<<rl.blocks, dim3(32, 8), 0, stream>>>(
            a, lp, sp, rl.block_per_row);
      else
        cross_entropy_forward_rows<T, L, 1><<<rl.blocks, dim3(32, 8), 0, stream>>>(
            a, lp, sp, rl.block_per_row);
      return cudaGetLastError();
    };
    if (loss_dtype == a.dtype) return run(T{});
    // Otherwise the compute type (a reduction over rows follows in f32/f64).
    const ScalarType compute = std::is_same_v<C, double> ? ScalarType::f64 : ScalarType::f32;
    if (loss_dtype == compute) return run(C{});
    return cudaErrorInvalidValue;
  });
}

cudaError_t cross_entropy_backward(const CrossEntropyArgs& a, const void* lse, const void* grad,
                                   bool per_row, double divisor, void* grad_logits,
                                   cudaStream_t stream) {
  if (a.n == 0 || a.c == 0) return cudaSuccess;
  return dispatch_float_type(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    constexpr int kVec = vec16_v<T>;
    const C* sp = static_cast<const C*>(lse);
    const T* gp = static_cast<const T*>(grad);
    T* out = static_cast<T*>(grad_logits);
    const C div = static_cast<C>(divisor);
    if (a.c % kVec == 0 && aligned16({a.logits, grad_logits}))
      cross_entropy_backward_flat<T, kVec><<<grid_for(a.n * a.c / kVec), kBlock, 0, stream>>>(
          a, sp, gp, per_row, div, out);
    else
      cross_entropy_backward_flat<T, 1><<<grid_for(a.n * a.c), kBlock, 0, stream>>>(
          a, sp, gp, per_row, div, out);
    return cudaGetLastError();
  });
}

}  // namespace lockstep::runtime::cuda::kernels
