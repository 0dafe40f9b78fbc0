// The CUDA side of softmax and log_softmax (runtime/ops/activation.h), without
// autograd: runtime/ops/activation.cpp records it for both devices. The
// pointwise activations use the elementwise kernels (cuda/ops/elementwise.h).
#pragma once

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::cuda {

// softmax (or log_softmax when `log`) of x along `dim` (any layout; f32, f64,
// bf16, f16, computed in f32 or f64); a contiguous result.
Tensor softmax_forward(const Tensor& x, int64_t dim, bool log);

// Gradient w.r.t. the input from the forward output y and its gradient.
Tensor softmax_backward(const Tensor& y, const Tensor& grad, int64_t dim, bool log);

}  // namespace lockstep::runtime::cuda
