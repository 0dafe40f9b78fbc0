// Softmax, log-softmax and cross-entropy kernels. Rows are reduced in f32
// (f64 for f64) whatever the storage dtype (f32, f64, bf16, f16), with the
// row maximum subtracted before exp; a warp reads a row of up to 1024
// elements, a block a longer one.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "lockstep/runtime/cuda/kernels/kernel_types.h"

namespace lockstep::runtime::cuda::kernels {

// A contiguous tensor seen as [outer, n, inner], softmax taken over n.
struct SoftmaxShape {
  int64_t outer = 0, n = 0, inner = 0;
};

// y = softmax(x) or log_softmax(x) (`log`); x and y of `dtype`.
cudaError_t softmax_forward(ScalarType dtype, bool log, const void* x, void* y,
                            const SoftmaxShape& s, cudaStream_t stream);

// From the forward output y and its gradient dy (both of `dtype`, contiguous):
// softmax: dx = y * (dy - sum(dy * y)); log_softmax: dx = dy - exp(y) * sum(dy).
cudaError_t softmax_backward(ScalarType dtype, bool log, const void* y, const void* dy, void* dx,
                             const SoftmaxShape& s, cudaStream_t stream);

// logits [n, c] contiguous of `dtype`, target [n] i64. With label smoothing s:
// loss_i = (1 - s) * (lse_i - x[i, t_i]) + s * (lse_i - mean_j x[i, j]),
// lse_i = log sum_j exp(x[i, j]). A target outside [0, c) gives a NaN loss
// (and NaN gradient row): the host cannot check indices without waiting.
// With `ignores`, a row whose target is ignore_index has loss 0 and a zero
// gradient row, whatever its logits (no 0 * inf).
struct CrossEntropyArgs {
  const void* logits = nullptr;
  ScalarType dtype = ScalarType::f32;
  const int64_t* target = nullptr;
  int64_t n = 0, c = 0;
  double smoothing = 0.0;
  bool ignores = false;
  int64_t ignore_index = 0;
};

// Per-row loss into `loss` (of `loss_dtype`) and lse into `lse` (f32, or f64
// for f64 logits), which backward takes.
cudaError_t cross_entropy_forward(const CrossEntropyArgs& args, void* loss, ScalarType loss_dtype,
                                  void* lse, cudaStream_t stream);

// grad_logits[i, j] = w_i * (softmax_ij - s / c) - (j == t_i) * w_i * (1 - s), with
// w_i = grad[i] (per_row) or grad[0], divided by `divisor` (n for a mean, else
// 1). grad and grad_logits are of the logits' dtype.
cudaError_t cross_entropy_backward(const CrossEntropyArgs& args, const void* lse,
                                   const void* grad, bool per_row, double divisor,
                                   void* grad_logits, cudaStream_t stream);

}  // namespace lockstep::runtime::cuda::kernels
