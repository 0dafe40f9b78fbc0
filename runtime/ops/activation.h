// Activations and (log-)softmax, differentiable.
#pragma once

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);  // exact (erf) form, PyTorch's default
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

}  // namespace lockstep::runtime
