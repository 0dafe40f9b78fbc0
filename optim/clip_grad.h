// Gradient clipping by global norm, torch.nn.utils.clip_grad_norm_, and by
// value, clip_grad_value_. Gradients of every floating dtype (f32, f64, bf16,
// f16) are read in double.
#pragma once

#include <vector>

#include "lockstep/runtime/tensor.h"

namespace lockstep::optim {

using runtime::Tensor;

// The norm of all gradients of `params` taken together, as if concatenated
// into one vector (params without a gradient are skipped). norm_type: any
// p > 0, or infinity for the largest absolute value. Accumulated in double.
double total_grad_norm(const std::vector<Tensor>& params, double norm_type = 2.0);

// For sharded optimizers: the norm's partial over this rank's parameters, in
// the form that adds up across shards — sum |g|^p for finite p, max |g| for
// infinity — and the norm from the combined partial.
double grad_norm_partial(const std::vector<Tensor>& params, double norm_type = 2.0);
double norm_from_partial(double partial, double norm_type = 2.0);

// Scales every gradient by max_norm / (total + 1e-6) when the total norm
// exceeds max_norm (PyTorch's rule and epsilon); returns the total norm
// before clipping. A non-finite total throws with error_if_nonfinite, else
// the gradients are scaled anyway (as PyTorch does) and NaN/inf is returned.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                      bool error_if_nonfinite = false);
// Applies a clip whose total norm is already known (e.g. combined across
// ZeRO shards); returns the scale used (1 when no clipping was needed).
double clip_grads_with_norm(const std::vector<Tensor>& params, double max_norm, double total_norm);

// Clamps every gradient of `params`, in place, to [-clip_value, clip_value]
// (params without a gradient are skipped); NaN stays NaN, as PyTorch's clamp.
// clip_value must be >= 0 (PyTorch would silently set every gradient to the
// negative value). On a device the clamp runs there, without a host wait.
void clip_grad_value(const std::vector<Tensor>& params, double clip_value);

}  // namespace lockstep::optim
