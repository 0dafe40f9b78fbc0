// Reductions over dims, differentiable (argmax is not).
#pragma once

#include <vector>

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

Tensor sum(const Tensor& a);  // all elements -> scalar (shape [])
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& a);
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim = false);
// Largest value along `dim`; the gradient goes to the first maximal element.
Tensor max(const Tensor& a, int64_t dim, bool keepdim = false);
// All elements -> scalar; its gradient is shared evenly by the elements equal
// to it (the NaNs when it is NaN), as in PyTorch.
Tensor max(const Tensor& a);
Tensor argmax(const Tensor& a, int64_t dim, bool keepdim = false);  // i64

}  // namespace lockstep::runtime
