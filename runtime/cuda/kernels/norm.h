// Normalisation kernels: layer norm forward and backward, and the parts of
// batch norm cuDNN does not cover (the eval-mode backward). Raw pointers to
// contiguous data; the host side (cuda/ops/norm.cpp) checks and allocates.
//
// dtypes: f32, f64, bf16, f16 for layer norm (statistics and arithmetic in
// f32, in f64 for f64), f32 and f64 for batch norm. Per-row or per-channel
// statistics (`mean`, `invstd`, `var`) have the accumulation type: f64 for
// f64 data, f32 otherwise. Every launcher queues work on `stream` and returns
// the launch error; none synchronises the host.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "lockstep/runtime/cuda/kernels/kernel_types.h"

namespace lockstep::runtime::cuda::kernels {

// ---- layer norm over rows of length d --------------------------------------

// y = (x - mean) * invstd * w + b per row, w and b optional (null); writes
// mean[rows] and invstd[rows] = 1 / sqrt(biased var + eps) for backward.
cudaError_t layer_norm_forward(ScalarType dtype, int64_t rows, int64_t d, const void* x,
                               const void* w, const void* b, double eps, void* y, void* mean,
                               void* invstd, cudaStream_t stream);

// grad_x = invstd * (g - mean(g) - xhat * mean(g * xhat)) per row, with
// g = grad_y * w (w optional) and xhat = (x - mean) * invstd.
cudaError_t layer_norm_backward_input(ScalarType dtype, int64_t rows, int64_t d,
                                      const void* grad_y, const void* x, const void* w,
                                      const void* mean, const void* invstd, void* grad_x,
                                      cudaStream_t stream);

// Row blocks the weight/bias gradient is split into: each reduces its rows
// into partial sums, a second kernel adds the partials in a fixed order.
inline int64_t layer_norm_param_chunks(int64_t rows) {
  const int64_t chunks = (rows + 127) / 128;
  return chunks < 1 ? 1 : (chunks > 256 ? 256 : chunks);
}
// Workspace bytes layer_norm_backward_params needs (f64 partials: exact
// enough for every dtype, and always 8-byte aligned).
inline std::size_t layer_norm_param_workspace(int64_t rows, int64_t d) {
  return static_cast<std::size_t>(2 * layer_norm_param_chunks(rows) * d) * sizeof(double);
}

// grad_w[j] = sum over rows of grad_y * xhat, grad_b[j] = sum of grad_y; either
// may be null. `workspace` holds layer_norm_param_workspace(rows, d) bytes.
cudaError_t layer_norm_backward_params(ScalarType dtype, int64_t rows, int64_t d,
                                       const void* grad_y, const void* x, const void* mean,
                                       const void* invstd, void* grad_w, void* grad_b,
                                       void* workspace, cudaStream_t stream);

// ---- batch norm in eval mode over x viewed as [n, c, inner] -----------------
// (statistics are the running ones: mean[c], var[c], in the data's dtype)

// grad_x = grad_y * w[c] / sqrt(var[c] + eps), w optional.
cudaError_t batch_norm_eval_backward_input(ScalarType dtype, int64_t n, int64_t c, int64_t inner,
                                           const void* grad_y, const void* w, const void* var,
                                           double eps, void* grad_x, cudaStream_t stream);

// grad_w[c] = sum(grad_y * (x - mean[c])) / sqrt(var[c] + eps), grad_b[c] =
// sum(grad_y), over n and inner; either may be null.
cudaError_t batch_norm_eval_backward_params(ScalarType dtype, int64_t n, int64_t c,
                                            int64_t inner, const void* grad_y, const void* x,
                                            const void* mean, const void* var, double eps,
                                            void* grad_w, void* grad_b, cudaStream_t stream);

}  // namespace lockstep::runtime::cuda::kernels
