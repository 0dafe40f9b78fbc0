// batch_norm and layer_norm of CUDA tensors: the device side of
// runtime/ops/norm.cpp, which checks shapes and dtypes for both devices and
// calls these for CUDA inputs and records the autograd node. Same semantics
// as the CPU ops (see runtime/ops/norm.h).
//
// batch_norm in training mode runs on cuDNN (statistics per channel over N
// and the spatial dims): through its graph API (cudnn_graph_batch_norm.h),
// else its legacy batch-norm calls, which cuDNN 9 marks deprecated but still
// ships (f64 always takes them). Both update the running variance with the
// unbiased batch variance, as the CPU op does. Eval mode, forward and
// backward, runs on kernels/norm.cu with the running statistics. f32 and f64.
// layer_norm's kernels run on kernels/norm.cu; f32, f64, bf16 and f16 (statistics in f32, f64 for f64).
#pragma once

#include <vector>

#include "lockstep/runtime/device_backend.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::cuda {

// x and out contiguous [n, c, ...]; weight, bias and the running statistics
// optional [c]. Training saves cuDNN's batch mean and invstd; eval saves the
// running mean and 1 / sqrt(running var + eps), copied.
NormStats batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             const Tensor& running_mean, const Tensor& running_var,
                             bool training, double momentum, double eps, Tensor& out);
void batch_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight,
                         const NormStats& stats, bool training, double eps, Tensor& grad_x,
                         Tensor& grad_weight, Tensor& grad_bias);

// x, w, b (w and b optional) and out contiguous on one device; `rows` rows of
// `d` values. The backward writes each gradient that is defined.
NormStats layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, int64_t rows,
                            int64_t d, double eps, Tensor& out);
void layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& w,
                         const NormStats& stats, int64_t rows, int64_t d, Tensor& grad_x,
                         Tensor& grad_weight, Tensor& grad_bias);

}  // namespace lockstep::runtime::cuda
