// The CUDA side of loss scaling (runtime/ops/amp.h, whose checks come
// first): one kernel launch per gradient on its device's current stream, and
// one single-thread launch for the scale's update.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::cuda {

void amp_unscale(const std::vector<Tensor>& grads, const Tensor& found_inf,
                 const Tensor& inv_scale);
void amp_update_scale(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                      double growth_factor, double backoff_factor, int64_t growth_interval);

}  // namespace lockstep::runtime::cuda
