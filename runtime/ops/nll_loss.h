// The negative log-likelihood loss over log-probabilities, as
// torch.nn.functional.nll_loss of PyTorch 1.13 for an input [N, C], and
// cross_entropy with a class weight, built on it.
#pragma once

#include <cstdint>
#include <optional>

#include "lockstep/runtime/ops/loss.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

struct NllOptions {
  // One weight per class, [C], of the input's dtype and device.
  std::optional<Tensor> weight;
  // Samples with this target add nothing. PyTorch's default is -100,
  // lockstep's none (as cross_entropy's): a target outside [0, C) is an error.
  std::optional<int64_t> ignore_index;
  Reduction reduction = Reduction::Mean;
};

// input [N, C] of log-probabilities (e.g. log_softmax(logits, 1)), target [N]
// of class indices (i64 or i32). Per sample -weight[t] * input[i, t], 0 for
// an ignored one. Mean divides the sum by the kept samples' weights summed
// (by their count without weights), PyTorch's weighted mean; when that is 0
// (no sample kept, or N = 0) Mean is 0 where PyTorch gives NaN, as
// cross_entropy. The targets are read on the host to check them, which
// waits for a device. Only [N, C] inputs: PyTorch's [N, C, d...] is refused.
Tensor nll_loss(const Tensor& input, const Tensor& target, const NllOptions& options = {});

// cross_entropy (ops/loss.h) with a class weight [C], PyTorch's weight=:
// per kept sample (1-s) w[t] (-logp[t]) + (s/C) sum_j w[j] (-logp[j]) with
// logp = log_softmax(logits), and Mean divided by the kept samples' w[t]
// summed, as PyTorch 1.13 (0 when that is 0, as nll_loss). Arguments and
// errors as the unweighted cross_entropy's; built from log_softmax and
// nll_loss's gathers rather than the fused kernel.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight,
                     double label_smoothing = 0.0, Reduction reduction = Reduction::Mean,
                     std::optional<int64_t> ignore_index = std::nullopt);

}  // namespace lockstep::runtime
