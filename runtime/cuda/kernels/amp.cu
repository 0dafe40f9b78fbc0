// Loss-scaling kernels (see amp.h). Threads that meet an inf or NaN all store
// the same 1.0f into found_inf: a benign race, as in PyTorch's kernel.
#include "lockstep/runtime/cuda/kernels/amp.h"

#include "lockstep/runtime/cuda/kernels/block_reduce.cuh"
#include "lockstep/runtime/cuda/kernels/device_types.cuh"

namespace lockstep::runtime::cuda::kernels {
namespace {

template <class T>
__global__ void unscale_kernel(ElementwiseArgs<1> a, float* __restrict__ found_inf,
                               const float* __restrict__ inv_scale) {
  using C = compute_t<T>;
  const C s = static_cast<C>(*inv_scale);
  const bool scaling = *inv_scale != 1.0f;  // PyTorch's rule: 1 leaves values as they are
  T* base = static_cast<T*>(a.data[0]);
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < a.numel; i += stride) {
    int64_t off[1] = {i};
    if (!a.contiguous) element_offsets(a, i, off);
    const C v = convert<C>(base[off[0]]);
    if (!isfinite(v)) *found_inf = 1.0f;
    if (scaling) base[off[0]] = convert<T>(v * s);
  }
}

__global__ void update_scale_kernel(float* scale, int32_t* tracker, const float* found_inf,
                                    double growth_factor, double backoff_factor,
                                    int64_t growth_interval) {
  // As the CPU op: products in double, stored as float.
  if (*found_inf != 0.0f) {
    *scale = static_cast<float>(*scale * backoff_factor);
    *tracker = 0;
    return;
  }
  const int64_t successful = int64_t{*tracker} + 1;
  if (successful == growth_interval) {
    const float grown = static_cast<float>(*scale * growth_factor);
    if (isfinite(grown)) *scale = grown;
    *tracker = 0;
  } else {
    *tracker = static_cast<int32_t>(successful);
  }
}

}  // namespace

cudaError_t amp_unscale(const ElementwiseArgs<1>& g, float* found_inf, const float* inv_scale,
                        cudaStream_t stream) {
  if (g.numel == 0) return cudaSuccess;
  return dispatch_float_type(g.dtype[0], [&](auto tag) {
    using T = decltype(tag);
    unscale_kernel<T><<<grid_for(g.numel), kBlock, 0, stream>>>(g, found_inf, inv_scale);
    return cudaGetLastError();
  });
}

cudaError_t amp_update_scale(float* scale, int32_t* growth_tracker, const float* found_inf,
                             double growth_factor, double backoff_factor,
                             int64_t growth_interval, cudaStream_t stream) {
  update_scale_kernel<<<1, 1, 0, stream>>>(scale, growth_tracker, found_inf, growth_factor,
                                           backoff_factor, growth_interval);
  return cudaGetLastError();
}

}  // namespace lockstep::runtime::cuda::kernels
