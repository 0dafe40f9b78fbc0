// The negative log-likelihood loss over log-probabilities, as
// torch.nn.functional.nll_loss of PyTorch 1.13. cross_entropy with a class
// weight (declared in ops/loss.h) is built on it.
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
// of class indices (i64 or i32); or, as PyTorch, input [N, C, d1, ...] with
// target [N, d1, ...], each position one sample (None gives the target's
// shape). Per sample -weight[t] * input[i, t], 0 for an ignored one. Mean
// divides the sum by the kept samples' weights summed (by their count
// without weights), PyTorch's weighted mean; when that is 0 (no sample kept,
// or N = 0) Mean is 0 where PyTorch gives NaN, as cross_entropy. The targets
// are read on the host to check them, which waits for a device.
Tensor nll_loss(const Tensor& input, const Tensor& target, const NllOptions& options = {});

}  // namespace lockstep::runtime
