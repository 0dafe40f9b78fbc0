// cross_entropy's CUDA kernels, reached through the CUDA backend from
// runtime/ops/loss.cpp, which checks shapes and dtypes and records the
// autograd node. f32, f64, bf16 and f16 logits, computed in f32 (f64 for
// f64); the result has the logits' dtype.
//
// Fused: one kernel computes each row's log-sum-exp and loss; a mean or sum
// over rows is a deterministic reduction kernel (cuda/ops/reduce.h), with no
// host synchronisation. Backward recomputes the softmax from the saved logits
// and per-row log-sum-exp in one elementwise pass. Target indices are not
// checked on the host (that would wait for the device): a target outside
// [0, C) makes its row's loss and gradient NaN; a row whose target is
// ignore_index (Reduction::None only) has loss 0 and a zero gradient row.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "lockstep/runtime/device_backend.h"
#include "lockstep/runtime/ops/loss.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::cuda {

// x: contiguous logits [N, C]; t: contiguous i64 targets [N]. Saves
// {x, t, per-row log-sum-exp}.
LossForward cross_entropy_forward(const Tensor& x, const Tensor& t, double label_smoothing,
                                  Reduction reduction, std::optional<int64_t> ignore_index);
Tensor cross_entropy_backward(const std::vector<Tensor>& saved, const Tensor& grad,
                              double label_smoothing, Reduction reduction,
                              std::optional<int64_t> ignore_index);

}  // namespace lockstep::runtime::cuda
