// cross_entropy of CUDA logits (runtime/ops/loss.h), autograd included;
// runtime/ops/loss.cpp checks shapes and dtypes first. f32, f64, bf16 and f16
// logits, computed in f32 (f64 for f64); the result has the logits' dtype.
//
// Fused: one kernel computes each row's log-sum-exp and loss; a mean or sum
// over rows is a deterministic reduction kernel (cuda/ops/reduce.h), with no
// host synchronisation. Backward recomputes the softmax from the saved logits
// and per-row log-sum-exp in one elementwise pass. Target indices are not
// checked on the host (that would wait for the device): a target outside
// [0, C) makes its row's loss and gradient NaN.
#pragma once

#include "lockstep/runtime/ops/loss.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::cuda {

Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing,
                     Reduction reduction);

}  // namespace lockstep::runtime::cuda
