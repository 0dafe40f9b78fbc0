// Batch and layer normalisation, differentiable.
#pragma once

#include <vector>

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

// x [N, C] or [N, C, *]. In training, normalises with the batch statistics
// (biased variance) and, when running_mean/var are defined, updates them in
// place with `momentum` using the unbiased variance, as PyTorch does. In eval,
// normalises with the running statistics. weight/bias ([C]) may be undefined.
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum = 0.1, double eps = 1e-5);

// Normalises over the trailing dims given by normalized_shape.
Tensor layer_norm(const Tensor& x, const std::vector<int64_t>& normalized_shape,
                  const Tensor& weight = {}, const Tensor& bias = {}, double eps = 1e-5);

}  // namespace lockstep::runtime
