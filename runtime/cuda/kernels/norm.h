// Normalisation kernels: layer norm forward and backward, batch norm in eval
// mode (cuDNN runs the training mode), and SyncBatchNorm's
// per-channel passes around its collectives. Raw pointers to contiguous
// data; the host side (cuda/ops/norm.cpp, cuda/ops/sync_batch_norm.cpp)
// checks and allocates.
//
// dtypes: f32, f64, bf16, f16 for layer norm (statistics and arithmetic in
// f32, in f64 for f64), f32 and f64 for batch norm. Per-row or per-channel
// statistics (`mean`, `invstd`, `var`) have the accumulation type: f64 for
// f64 data, f32 otherwise -- except SyncBatchNorm's, always f64. Every
// launcher queues work on `stream` and returns the launch error; none
// synchronises the host.
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
// (statistics are the running ones: mean[c] and invstd[c] = 1 / sqrt(var[c] +
// eps), in the data's dtype)

// y = (x - mean[c]) * w[c] * invstd[c] + b[c], w and b optional.
cudaError_t batch_norm_eval_forward(ScalarType dtype, int64_t n, int64_t c, int64_t inner,
                                    const void* x, const void* w, const void* b, const void* mean,
                                    const void* invstd, void* y, cudaStream_t stream);

// grad_x = grad_y * w[c] * invstd[c], w optional.
cudaError_t batch_norm_eval_backward_input(ScalarType dtype, int64_t n, int64_t c, int64_t inner,
                                           const void* grad_y, const void* w, const void* invstd,
                                           void* grad_x, cudaStream_t stream);

// grad_w[c] = sum(grad_y * (x - mean[c])) * invstd[c], grad_b[c] = sum(grad_y),
// over n and inner; either may be null.
cudaError_t batch_norm_eval_backward_params(ScalarType dtype, int64_t n, int64_t c,
                                            int64_t inner, const void* grad_y, const void* x,
                                            const void* mean, const void* invstd, void* grad_w,
                                            void* grad_b, cudaStream_t stream);

// ---- SyncBatchNorm over x viewed as [n, c, inner] ----------------------------
// f32 and f64 data (`dtype`); statistics, gradient sums and the buffers that
// cross ranks in f64. The per-channel reductions split each channel's values
// into chunks: one block reduces a chunk into a partial result in
// `workspace`, a second kernel combines a channel's partials in chunk order
// (deterministic: no atomics; the result depends only on the shape).

// Chunks per channel: enough blocks to fill the device, yet at least ~4096
// values (64 rows when inner == 1) per block. 0 when there are no values.
inline int64_t channel_reduce_chunks(int64_t n, int64_t c, int64_t inner) {
  const int64_t count = n * inner;
  if (count == 0 || c == 0) return 0;
  const int64_t blocks_per_chunk = inner == 1 ? (c + 31) / 32 : c;
  const int64_t by_size = inner == 1 ? (n + 63) / 64 : (count + 4095) / 4096;
  const int64_t by_fill = (512 + blocks_per_chunk - 1) / blocks_per_chunk;
  const int64_t chunks = by_size < by_fill ? by_size : by_fill;
  return chunks < 1 ? 1 : (chunks > 65535 ? 65535 : chunks);
}
// Workspace bytes channel_stats and channel_grad_sums need (3 doubles per
// chunk and channel), at least 8.
inline std::size_t channel_reduce_workspace(int64_t n, int64_t c, int64_t inner) {
  const int64_t doubles = 3 * channel_reduce_chunks(n, c, inner) * c;
  return static_cast<std::size_t>(doubles > 0 ? doubles : 1) * sizeof(double);
}

// mean[c] and biased var[c] of each channel (0 and 0 when n * inner == 0;
// per-thread Welford merged with Chan's formula, no E[x^2] - E[x]^2
// cancellation); count, when not null, gets n * inner, so that mean, var
// and count can be one packed buffer.
cudaError_t channel_stats(ScalarType dtype, int64_t n, int64_t c, int64_t inner, const void* x,
                          double* mean, double* var, double* count, void* workspace,
                          cudaStream_t stream);

// From `gathered`, world * (2c + 1) doubles: every rank's [mean | var | count]
// in rank order. Combines them (Chan et al.: M2 = sum_r n_r * (var_r +
// (mean_r - mean)^2)) and writes stats[2c + 1] = [mean | invstd | count] with
// invstd = 1 / sqrt(var + eps); scale[c] = w * invstd and shift[c] = b -
// mean * w * invstd (data dtype; w and b optional: 1 and 0); and, when
// running_mean/var are given (data dtype) and the count is > 1, updates them
// in place: r = (1 - momentum) * r + momentum * batch, with the unbiased
// variance var * count / (count - 1). A count of 0 gives mean 0 and var 0.
cudaError_t sync_batch_norm_combine(ScalarType dtype, int world, int64_t c,
                                    const double* gathered, double eps, double momentum,
                                    const void* w, const void* b, void* running_mean,
                                    void* running_var, double* stats, void* scale, void* shift,
                                    cudaStream_t stream);

// y = x * scale[ch] + shift[ch] (scale and shift of the data dtype).
cudaError_t channel_affine(ScalarType dtype, int64_t n, int64_t c, int64_t inner, const void* x,
                           const void* scale, const void* shift, void* y, cudaStream_t stream);

// sum_gy[c] = sum(gy), sum_gy_xc[c] = sum(gy * (x - mean[c])) over this
// rank's values; when not null, grad_w = sum_gy_xc * invstd and grad_b =
// sum_gy (data dtype): the local weight and bias gradients.
cudaError_t channel_grad_sums(ScalarType dtype, int64_t n, int64_t c, int64_t inner,
                              const void* gy, const void* x, const double* mean,
                              const double* invstd, double* sum_gy, double* sum_gy_xc,
                              void* grad_w, void* grad_b, void* workspace, cudaStream_t stream);

// The input gradient's coefficients from sums[2c] = [sum_gy | sum_gy_xc]
// summed over ranks and stats = [mean | invstd | count] of the forward:
// gx = w * invstd * (gy - sum_gy / m - (x - mean) * invstd^2 * sum_gy_xc / m)
// with m the global count, folded into gx = gy * ka + x * kb + kc; writes
// coef[3c] = [ka | kb | kc] (data dtype; w optional: 1).
cudaError_t sync_batch_norm_coefficients(ScalarType dtype, int64_t c, const double* sums,
                                         const double* stats, const void* w, void* coef,
                                         cudaStream_t stream);

// gx = gy * ka[ch] + x * kb[ch] + kc[ch], with coef = [ka | kb | kc].
cudaError_t channel_grad_input(ScalarType dtype, int64_t n, int64_t c, int64_t inner,
                               const void* gy, const void* x, const void* coef, void* gx,
                               cudaStream_t stream);

}  // namespace lockstep::runtime::cuda::kernels
