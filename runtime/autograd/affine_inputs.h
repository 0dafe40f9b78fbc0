// The autograd bookkeeping shared by the normalisations with an optional
// affine weight and bias (batch norm, layer norm, SyncBatchNorm): the inputs
// [x, weight?, bias?], the tensors backward reads [x, weight?], and where
// weight and bias sit among the inputs.
#pragma once

#include <vector>

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

struct AffineInputs {
  std::vector<Tensor> inputs, saved;
  int w_at = -1, b_at = -1;  // -1: absent
};

// `x_saved` and `weight_saved` are what backward reads in place of x and
// weight (e.g. their contiguous copies).
inline AffineInputs affine_inputs(const Tensor& x, const Tensor& x_saved, const Tensor& weight,
                                  const Tensor& weight_saved, const Tensor& bias) {
  AffineInputs a{{x}, {x_saved}};
  if (weight.defined()) {
    a.w_at = static_cast<int>(a.inputs.size());
    a.inputs.push_back(weight);
    a.saved.push_back(weight_saved);
  }
  if (bias.defined()) {
    a.b_at = static_cast<int>(a.inputs.size());
    a.inputs.push_back(bias);
  }
  return a;
}

}  // namespace lockstep::runtime
