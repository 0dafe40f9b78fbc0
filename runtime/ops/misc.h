// Dropout, embedding lookup and concatenation, differentiable.
#pragma once

#include <optional>
#include <vector>

#include "lockstep/runtime/random.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

// Zeroes each element with probability p and scales the rest by 1/(1-p);
// identity when !training or p == 0. The mask comes from `g`.
Tensor dropout(const Tensor& x, double p, bool training, Generator& g = default_generator());

// indices (i64 or i32, any shape) into weight [num, dim] -> [..., dim].
// Row padding_idx, as PyTorch's, is looked up as it is but gets no gradient;
// a negative one counts from the end (-1 is row num - 1).
Tensor embedding(const Tensor& indices, const Tensor& weight,
                 std::optional<int64_t> padding_idx = std::nullopt);

// A 1-D tensor of no elements is left out whatever the others' shapes, as in
// PyTorch (cat({empty, x}) appends to an empty start).
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);

}  // namespace lockstep::runtime
