// Loss-scaling kernels for mixed precision, as PyTorch's
// torch._amp_foreach_non_finite_check_and_unscale_ and torch._amp_update_scale_
// (optim/grad_scaler.h drives them). No autograd; every 1-element tensor stays
// on the gradients' device, so a CUDA caller never waits for the device.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

// One pass over each gradient: g *= inv_scale in place (computed in float for
// bf16/f16, in the gradient's dtype for f32/f64) and found_inf = 1 when an
// element was inf or NaN before scaling; otherwise found_inf is left as it is.
// grads: f32, f64, bf16 or f16, any strides but expanded ones (checked before
// any is written), on the device of found_inf and inv_scale (1-element f32
// tensors). Bumps each gradient's version.
void amp_unscale_(const std::vector<Tensor>& grads, const Tensor& found_inf,
                  const Tensor& inv_scale);

// The scale after one iteration: found_inf != 0: scale *= backoff_factor and
// growth_tracker = 0; else growth_tracker += 1, and on reaching
// growth_interval scale *= growth_factor (kept only if finite) and
// growth_tracker = 0. scale: 1-element f32, growth_tracker: 1-element i32,
// found_inf: 1-element f32, all on one device. In place.
void amp_update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                       double growth_factor, double backoff_factor, int64_t growth_interval);

}  // namespace lockstep::runtime
