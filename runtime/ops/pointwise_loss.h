// Losses taken element by element over an input and a target of one shape,
// as torch.nn.functional's of PyTorch 1.13, differentiable w.r.t. the input
// (and the target, where PyTorch's is). Every one is built from ops that run
// on every device.
//
// Common to all: input and target must have the same shape (an error names
// both; PyTorch refuses it for the BCE losses and broadcasts, mostly with a
// warning, for the others); Mean divides by the number of elements, and over no
// elements is 0, as mse_loss and cross_entropy (PyTorch gives NaN).
#pragma once

#include <optional>

#include "lockstep/runtime/ops/loss.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

struct BceOptions {
  // Multiplies each element's loss; broadcast to the input's shape (e.g. [C]).
  std::optional<Tensor> weight;
  Reduction reduction = Reduction::Mean;
};

struct BceWithLogitsOptions {
  std::optional<Tensor> weight;  // as BceOptions::weight
  // Weight of the positive term, broadcast to the input's shape (one per
  // class, [C], for an input [N, C]): loss = -w [pw y log s(x) + (1-y) log(1-s(x))].
  std::optional<Tensor> pos_weight;
  Reduction reduction = Reduction::Mean;
};

// -w [y log x + (1-y) log(1-x)] with each log clamped at -100 (PyTorch's
// rule: x = 0 or 1 gives 100, never inf). The gradient is PyTorch's,
// w (x - y) / max(x (1-x), 1e-12). An input outside [0, 1] (or NaN) is an
// error, as in PyTorch; checking it reads one number back from a device.
// A weight that requires grad gets its gradient, the unweighted loss summed
// to its shape (PyTorch 1.13 refuses such a weight).
Tensor binary_cross_entropy(const Tensor& input, const Tensor& target,
                            const BceOptions& options = {});

// binary_cross_entropy(sigmoid(x), y) without its overflow: with m = max(-x, 0),
// (1-y) x + (1 + (pw-1) y) (log(exp(-m) + exp(-x-m)) + m), as PyTorch.
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        const BceWithLogitsOptions& options = {});

// |x - y|.
Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

// 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (d = x - y). beta = 0
// is l1_loss; a negative beta is an error.
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target,
                      Reduction reduction = Reduction::Mean, double beta = 1.0);

// 0.5 d^2 where |d| <= delta, else delta (|d| - 0.5 delta): beta * smooth_l1
// with beta = delta. delta must be > 0.
Tensor huber_loss(const Tensor& input, const Tensor& target,
                  Reduction reduction = Reduction::Mean, double delta = 1.0);

// kl_div's reductions: PyTorch's 'mean' (over every element, which is not the
// KL divergence; PyTorch warns) is the default, as there; BatchMean (the sum
// over the batch size, input.shape()[0]) is the KL divergence per sample.
enum class KlDivReduction { Mean, BatchMean, Sum, None };

// The pointwise KL divergence of the target from the input's distribution,
// input holding log-probabilities: target (log target - input), 0 where the
// target is 0 (a negative target gives NaN, as in PyTorch); with log_target,
// exp(target) (target - input), NaN for a log target of -inf as in PyTorch
// (pass probabilities when they hold zeros). The input's gradient is -target
// (or -exp(target)); the target's, where PyTorch gives NaN at a target of 0,
// is -input there. BatchMean over an empty batch is 0, as Mean.
Tensor kl_div(const Tensor& input, const Tensor& target,
              KlDivReduction reduction = KlDivReduction::Mean, bool log_target = false);

}  // namespace lockstep::runtime
