// Fused optimizer updates: one kernel launch steps many f32 parameters
// (SGD with momentum, Adam/AdamW), instead of one launch per parameter and
// op. The per-parameter pointers travel in the kernel's parameter block
// (CUDA 12.1+ allows 32 KiB of it on sm_70 and newer), so nothing is copied
// to the device first and the host never waits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lockstep::runtime::cuda::kernels {

inline constexpr int kMaxFusedTensors = 320;

// Up to kMaxFusedTensors tensors with K pointers each (the parameter, its
// gradient, its state tensors), all f32 and contiguous, and two per-tensor
// coefficients. Tensor i holds elements [end[i-1], end[i]) of the launch.
template <int K>
struct TensorTable {
  int count = 0;
  int64_t end[kMaxFusedTensors] = {};
  float* ptr[K][kMaxFusedTensors] = {};
  float coef[2][kMaxFusedTensors] = {};
};

// Pointers: param, grad, momentum buffer. coef[0]: 1 when the buffer is new
// (it starts as the gradient, as in PyTorch), else 0.
struct SgdCoefficients {
  float neg_lr, momentum, one_minus_dampening, weight_decay;
  bool has_weight_decay, has_momentum, nesterov, maximize;
};
cudaError_t sgd_step(const TensorTable<3>& table, const SgdCoefficients& c, cudaStream_t stream);

// Pointers: param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq (amsgrad only).
// coef[0]: -lr / bias_correction1, coef[1]: sqrt(bias_correction2), per
// tensor since each counts its own steps.
struct AdamCoefficients {
  float decay;  // AdamW: 1 - lr * weight_decay
  float weight_decay, beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  bool l2, decoupled, amsgrad, maximize;
};
cudaError_t adam_step(const TensorTable<5>& table, const AdamCoefficients& c, cudaStream_t stream);

}  // namespace lockstep::runtime::cuda::kernels
