// 2-D pooling kernels over contiguous [planes, h, w] data (planes = N * C),
// f32, f64, bf16 and f16 (summed in f32, f64 for f64). Same windows, NaN rule
// and divisors as the CPU kernels (runtime/ops/pool_kernels.h). Backward is a
// gather: each input element sums the outputs whose windows hold it, in
// output order, so no atomics and deterministic results; every element of
// every output buffer is written.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "lockstep/runtime/cuda/kernels/kernel_types.h"

namespace lockstep::runtime::cuda::kernels {

struct Pool2dShape {
  int64_t planes = 0, h = 0, w = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0;  // fixed windows only
  int64_t oh = 0, ow = 0;
};

// y = window maxima; argmax = flat in-plane index (ih * w + iw) of each.
cudaError_t max_pool2d_forward(ScalarType dtype, const Pool2dShape& s, const void* x, void* y,
                               int32_t* argmax, cudaStream_t stream);
cudaError_t max_pool2d_backward(ScalarType dtype, const Pool2dShape& s, const void* grad_y,
                                const int32_t* argmax, void* grad_x, cudaStream_t stream);

// Average pooling: fixed windows (count_include_pad = true), or adaptive ones
// (output cell i averages rows [floor(i*h/oh), ceil((i+1)*h/oh)), columns alike).
cudaError_t avg_pool2d_forward(ScalarType dtype, bool adaptive, const Pool2dShape& s,
                               const void* x, void* y, cudaStream_t stream);
cudaError_t avg_pool2d_backward(ScalarType dtype, bool adaptive, const Pool2dShape& s,
                                const void* grad_y, void* grad_x, cudaStream_t stream);

}  // namespace lockstep::runtime::cuda::kernels
