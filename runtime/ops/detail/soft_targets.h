// Internal: cross_entropy with class probabilities as the target, PyTorch's
// rule when the target has the logits' shape. Shared by both cross_entropy
// overloads (ops/loss.cpp, ops/nll_loss.cpp).
#pragma once

#include <cstdint>
#include <optional>

#include "lockstep/runtime/ops/loss.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::detail {

// logits and probs [N, C, d1, ...] (or [N, C]); weight [C] or undefined.
Tensor probability_cross_entropy(const Tensor& logits, const Tensor& probs, const Tensor& weight,
                                 double label_smoothing, Reduction reduction,
                                 std::optional<int64_t> ignore_index);

}  // namespace lockstep::runtime::detail
