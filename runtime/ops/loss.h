// Losses, differentiable w.r.t. the input.
#pragma once

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

enum class Reduction { Mean, Sum, None };

// logits [N, C], target [N] of class indices (i64 or i32). With label
// smoothing s the target distribution is (1-s)*onehot + s/C, as in PyTorch.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing = 0.0,
                     Reduction reduction = Reduction::Mean);
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

}  // namespace lockstep::runtime
