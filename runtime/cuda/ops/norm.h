// batch_norm and layer_norm of CUDA tensors: the device side of
// runtime/ops/norm.cpp, which checks shapes and dtypes for both devices and
// calls these for CUDA inputs. Same semantics as the CPU ops (see
// runtime/ops/norm.h), autograd included.
//
// batch_norm in training mode runs on cuDNN (statistics per channel over N
// and the spatial dims): through its graph API (cudnn_graph_batch_norm.h),
// else its legacy batch-norm calls, which cuDNN 9 marks deprecated but still
// ships (f64 always takes them). Both update the running variance with the
// unbiased batch variance, as the CPU op does. Eval mode, forward and
// backward, runs on kernels/norm.cu with the running statistics. f32 and f64.
// layer_norm runs on kernels/norm.cu; f32, f64, bf16 and f16 (statistics in
// f32, f64 for f64).
#pragma once

#include <vector>

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::cuda {

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum, double eps);

Tensor layer_norm(const Tensor& x, const std::vector<int64_t>& normalized_shape,
                  const Tensor& weight, const Tensor& bias, double eps);

}  // namespace lockstep::runtime::cuda
