// Losses, differentiable w.r.t. the input.
#pragma once

#include <cstdint>
#include <optional>

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

enum class Reduction { Mean, Sum, None };

// logits [N, C], target [N] of class indices (i64 or i32); or, as PyTorch,
// logits [N, C, d1, ...] with target [N, d1, ...], each position one sample
// (Mean over all of them, None of the target's shape). With label
// smoothing s the target distribution is (1-s)*onehot + s/C, as in PyTorch.
// With ignore_index, a sample whose target equals it adds nothing (its loss
// and gradient are exactly 0, whatever its logits; None gives it 0) and Mean
// divides by the samples kept: 0 when none is kept, as for an empty batch,
// where PyTorch gives NaN. Sum and Mean add the kept losses in f32 (f64 for
// f64 logits) and round once, so 16-bit logits do not overflow the sum.
// PyTorch ignores -100 unless told otherwise; lockstep only when asked, and
// a target outside [0, C) is otherwise an error.
// A floating target of the logits' shape holds class probabilities q, as in
// PyTorch: per sample -sum_c q[c] logp[c] (q smoothed to (1-s) q + s/C), and
// Mean divides by the samples (and positions), weighted or not; an
// ignore_index >= 0 is refused there, as PyTorch does.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing = 0.0,
                     Reduction reduction = Reduction::Mean,
                     std::optional<int64_t> ignore_index = std::nullopt);

// The same with a class weight [C], PyTorch's weight=: per kept sample
// (1-s) w[t] (-logp[t]) + (s/C) sum_j w[j] (-logp[j]) with
// logp = log_softmax(logits, 1), and Mean divided by the kept samples' w[t]
// summed, as PyTorch 1.13 (0 when that is 0). Built from log_softmax and
// nll_loss's gathers (ops/nll_loss.h) rather than the fused kernel.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight,
                     double label_smoothing = 0.0, Reduction reduction = Reduction::Mean,
                     std::optional<int64_t> ignore_index = std::nullopt);

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

}  // namespace lockstep::runtime
