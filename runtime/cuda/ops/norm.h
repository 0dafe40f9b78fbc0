// batch_norm and layer_norm of CUDA tensors: the device side of
// runtime/ops/norm.cpp, which checks shapes and dtypes for both devices and
// calls these for CUDA inputs. Same semantics as the CPU ops (see
// runtime/ops/norm.h), autograd included.
//
// batch_norm runs on cuDNN (spatial mode: statistics per channel over N and
// the spatial dims): training forward and backward with the batch
// statistics, eval forward with the running ones; the eval backward, which
// cuDNN does not offer, on kernels/norm.cu. cuDNN updates the running
// variance with the unbiased batch variance, as the CPU op does. f32 and f64.
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
