// Loss-scaling kernels (runtime/ops/amp.h): unscale one gradient while
// flagging inf/NaN, and the scale's update. The 1-element operands are read
// and written on the device, so the host never waits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "lockstep/runtime/cuda/kernels/kernel_types.h"

namespace lockstep::runtime::cuda::kernels {

// g *= *inv_scale in place (f32 arithmetic for bf16/f16) over the iteration
// space `g` (one floating operand, any strides); *found_inf = 1 where an
// element was inf or NaN before scaling.
cudaError_t amp_unscale(const ElementwiseArgs<1>& g, float* found_inf, const float* inv_scale,
                        cudaStream_t stream);

// One thread: the update rule of runtime::amp_update_scale_.
cudaError_t amp_update_scale(float* scale, int32_t* growth_tracker, const float* found_inf,
                             double growth_factor, double backoff_factor,
                             int64_t growth_interval, cudaStream_t stream);

}  // namespace lockstep::runtime::cuda::kernels
