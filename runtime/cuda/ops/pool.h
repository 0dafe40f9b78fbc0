// The CUDA side of runtime/ops/pool.cpp, which checks the arguments, allocates
// the outputs (contiguous, on the input's device) and records autograd for
// both devices. These queue the kernels (cuda/kernels/pool.h) that fill the
// outputs. f32, f64, bf16 and f16.
#pragma once

#include "lockstep/runtime/ops/pool_kernels.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::cuda {

using pool_kernels::PoolShape;

// y = window maxima of x; argmax (i32) = flat in-plane index of each.
void max_pool2d_forward(const PoolShape& s, const Tensor& x, const Tensor& y,
                        const Tensor& argmax);
void max_pool2d_backward(const PoolShape& s, const Tensor& grad_y, const Tensor& argmax,
                         const Tensor& grad_x);

// Fixed windows (avg_pool2d, count_include_pad) or adaptive ones.
void avg_pool2d_forward(const PoolShape& s, bool adaptive, const Tensor& x, const Tensor& y);
void avg_pool2d_backward(const PoolShape& s, bool adaptive, const Tensor& grad_y,
                         const Tensor& grad_x);

}  // namespace lockstep::runtime::cuda
