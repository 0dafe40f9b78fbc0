// Pooling kernels (see pool.h): a thread per output element forward, a thread
// per input element backward.
#include "lockstep/runtime/cuda/kernels/pool.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "lockstep/runtime/cuda/kernels/block_reduce.cuh"
#include "lockstep/runtime/cuda/kernels/device_types.cuh"

namespace lockstep::runtime::cuda::kernels {
namespace {

// Rows (or columns) [start, end) of a window, clipped to the image, and the
// count its average divides by.
struct Window {
  int64_t start, end, divisor;
};

// Fixed window of output o: [o*stride - pad, + k), its divisor clipped to the
// padded image only (count_include_pad = true).
__device__ __forceinline__ Window fixed_window(int64_t o, int64_t stride, int64_t pad, int64_t k,
                                               int64_t size) {
  const int64_t lo = o * stride - pad;
  const int64_t hi = min(lo + k, size + pad);
  return {max(lo, int64_t{0}), min(hi, size), hi - lo};
}

__device__ __forceinline__ Window adaptive_window(int64_t o, int64_t in, int64_t out) {
  const int64_t lo = (o * in) / out, hi = ((o + 1) * in + out - 1) / out;
  return {lo, hi, hi - lo};
}

template <bool Adaptive>
__device__ __forceinline__ Window window_h(const Pool2dShape& s, int64_t o) {
  if constexpr (Adaptive) return adaptive_window(o, s.h, s.oh);
  else return fixed_window(o, s.sh, s.ph, s.kh, s.h);
}

template <bool Adaptive>
__device__ __forceinline__ Window window_w(const Pool2dShape& s, int64_t o) {
  if constexpr (Adaptive) return adaptive_window(o, s.w, s.ow);
  else return fixed_window(o, s.sw, s.pw, s.kw, s.w);
}

// Outputs along one axis whose windows may hold input i: a superset, each
// candidate is tested against its window.
template <bool Adaptive>
__device__ __forceinline__ void candidates(int64_t i, int64_t stride, int64_t pad, int64_t k,
                                           int64_t in, int64_t out, int64_t& first,
                                           int64_t& last) {
  if constexpr (Adaptive) {
    first = (i * out) / in - 1;
    last = ((i + 1) * out + in - 1) / in;
  } else {
    // o * stride - pad <= i < o * stride - pad + k
    const int64_t low = i + pad - k + 1;
    first = low <= 0 ? 0 : (low + stride - 1) / stride;
    last = (i + pad) / stride;
  }
  first = max(first, int64_t{0});
  last = min(last, out - 1);
}

// Splits flat index e of [planes, rows, cols].
__device__ __forceinline__ void split3(int64_t e, int64_t rows, int64_t cols, int64_t& plane,
                                       int64_t& r, int64_t& c) {
  c = e % cols;
  const int64_t t = e / cols;
  r = t % rows;
  plane = t / rows;
}

#define LOCKSTEP_GRID_STRIDE(e, total)                                                    \
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < (total); \
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <class T>
__global__ void max_pool_forward_kernel(const Pool2dShape s, const T* __restrict__ x,
                                        T* __restrict__ y, int32_t* __restrict__ argmax) {
  using C = compute_t<T>;
  LOCKSTEP_GRID_STRIDE(e, s.planes * s.oh * s.ow) {
    int64_t pl, oh, ow;
    split3(e, s.oh, s.ow, pl, oh, ow);
    const Window wh = window_h<false>(s, oh), ww = window_w<false>(s, ow);
    const T* xp = x + pl * s.h * s.w;
    // padding <= kernel / 2 (checked on the host) keeps every window non-empty.
    int64_t at = wh.start * s.w + ww.start;
    C best = convert<C>(xp[at]);
    for (int64_t ih = wh.start; ih < wh.end; ++ih)
      for (int64_t iw = ww.start; iw < ww.end; ++iw) {
        const C v = convert<C>(xp[ih * s.w + iw]);
        if (v > best || v != v) best = v, at = ih * s.w + iw;  // NaN wins, as on the CPU
      }
    y[e] = convert<T>(best);
    argmax[e] = static_cast<int32_t>(at);
  }
}

template <class T>
__global__ void max_pool_backward_kernel(const Pool2dShape s, const T* __restrict__ grad_y,
                                         const int32_t* __restrict__ argmax,
                                         T* __restrict__ grad_x) {
  using C = compute_t<T>;
  LOCKSTEP_GRID_STRIDE(e, s.planes * s.h * s.w) {
    int64_t pl, ih, iw;
    split3(e, s.h, s.w, pl, ih, iw);
    int64_t oh0, oh1, ow0, ow1;
    candidates<false>(ih, s.sh, s.ph, s.kh, s.h, s.oh, oh0, oh1);
    candidates<false>(iw, s.sw, s.pw, s.kw, s.w, s.ow, ow0, ow1);
    const int64_t plane_out = pl * s.oh * s.ow;
    const int32_t self = static_cast<int32_t>(ih * s.w + iw);
    C acc = C(0);
    for (int64_t oh = oh0; oh <= oh1; ++oh)
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        const int64_t q = plane_out + oh * s.ow + ow;
        if (argmax[q] == self) acc += convert<C>(grad_y[q]);
      }
    grad_x[e] = convert<T>(acc);
  }
}

template <class T, bool Adaptive>
__global__ void avg_pool_forward_kernel(const Pool2dShape s, const T* __restrict__ x,
                                        T* __restrict__ y) {
  using C = compute_t<T>;
  LOCKSTEP_GRID_STRIDE(e, s.planes * s.oh * s.ow) {
    int64_t pl, oh, ow;
    split3(e, s.oh, s.ow, pl, oh, ow);
    const Window wh = window_h<Adaptive>(s, oh), ww = window_w<Adaptive>(s, ow);
    const T* xp = x + pl * s.h * s.w;
    C sum = C(0);
    for (int64_t ih = wh.start; ih < wh.end; ++ih)
      for (int64_t iw = ww.start; iw < ww.end; ++iw) sum += convert<C>(xp[ih * s.w + iw]);
    y[e] = convert<T>(sum / static_cast<C>(wh.divisor * ww.divisor));
  }
}

template <class T, bool Adaptive>
__global__ void avg_pool_backward_kernel(const Pool2dShape s, const T* __restrict__ grad_y,
                                         T* __restrict__ grad_x) {
  using C = compute_t<T>;
  LOCKSTEP_GRID_STRIDE(e, s.planes * s.h * s.w) {
    int64_t pl, ih, iw;
    split3(e, s.h, s.w, pl, ih, iw);
    int64_t oh0, oh1, ow0, ow1;
    candidates<Adaptive>(ih, s.sh, s.ph, s.kh, s.h, s.oh, oh0, oh1);
    candidates<Adaptive>(iw, s.sw, s.pw, s.kw, s.w, s.ow, ow0, ow1);
    const int64_t plane_out = pl * s.oh * s.ow;
    C acc = C(0);
    for (int64_t oh = oh0; oh <= oh1; ++oh) {
      const Window wh = window_h<Adaptive>(s, oh);
      if (ih < wh.start || ih >= wh.end) continue;
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        const Window ww = window_w<Adaptive>(s, ow);
        if (iw < ww.start || iw >= ww.end) continue;
        acc += convert<C>(grad_y[plane_out + oh * s.ow + ow]) /
               static_cast<C>(wh.divisor * ww.divisor);
      }
    }
    grad_x[e] = convert<T>(acc);
  }
}

#undef LOCKSTEP_GRID_STRIDE

}  // namespace

cudaError_t max_pool2d_forward(ScalarType dtype, const Pool2dShape& s, const void* x, void* y,
                               int32_t* argmax, cudaStream_t stream) {
  const int64_t total = s.planes * s.oh * s.ow;
  if (total == 0) return cudaSuccess;
  return dispatch_float_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    max_pool_forward_kernel<T><<<grid_for(total), kBlock, 0, stream>>>(
        s, static_cast<const T*>(x), static_cast<T*>(y), argmax);
    return cudaGetLastError();
  });
}

cudaError_t max_pool2d_backward(ScalarType dtype, const Pool2dShape& s, const void* grad_y,
                                const int32_t* argmax, void* grad_x, cudaStream_t stream) {
  const int64_t total = s.planes * s.h * s.w;
  if (total == 0) return cudaSuccess;
  return dispatch_float_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    max_pool_backward_kernel<T><<<grid_for(total), kBlock, 0, stream>>>(
        s, static_cast<const T*>(grad_y), argmax, static_cast<T*>(grad_x));
    return cudaGetLastError();
  });
}

cudaError_t avg_pool2d_forward(ScalarType dtype, bool adaptive, const Pool2dShape& s,
                               const void* x, void* y, cudaStream_t stream) {
  const int64_t total = s.planes * s.oh * s.ow;
  if (total == 0) return cudaSuccess;
  return dispatch_float_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x);
    T* yp = static_cast<T*>(y);
    if (adaptive)
      avg_pool_forward_kernel<T, true><<<grid_for(total), kBlock, 0, stream>>>(s, xp, yp);
    else
      avg_pool_forward_kernel<T, false><<<grid_for(total), kBlock, 0, stream>>>(s, xp, yp);
    return cudaGetLastError();
  });
}

cudaError_t avg_pool2d_backward(ScalarType dtype, bool adaptive, const Pool2dShape& s,
                                const void* grad_y, void* grad_x, cudaStream_t stream) {
  const int64_t total = s.planes * s.h * s.w;
  if (total == 0) return cudaSuccess;
  return dispatch_float_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* gy = static_cast<const T*>(grad_y);
    T* gx = static_cast<T*>(grad_x);
    if (adaptive)
      avg_pool_backward_kernel<T, true><<<grid_for(total), kBlock, 0, stream>>>(s, gy, gx);
    else
      avg_pool_backward_kernel<T, false><<<grid_for(total), kBlock, 0, stream>>>(s, gy, gx);
    return cudaGetLastError();
  });
}

}  // namespace lockstep::runtime::cuda::kernels
