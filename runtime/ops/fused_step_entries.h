// The entries of a fused optimizer step (fused_step.h): one per tensor, read
// by the device's kernel from a table in device memory. Plain data, no
// lockstep or CUDA header, so that the kernels include it too.
#pragma once

#include <cstdint>

namespace lockstep::runtime {

// Flags of an entry.
enum FusedFlag : uint32_t {
  kMaximize = 1u << 0,
  kWeightDecay = 1u << 1,  // SGD: d += weight_decay * p
  kMomentum = 1u << 2,     // SGD
  kNesterov = 1u << 3,     // SGD
  kFirstStep = 1u << 4,    // SGD: the momentum buffer is new and starts as d, as in PyTorch
  kL2 = 1u << 5,           // Adam: g += weight_decay * p
  kDecoupled = 1u << 6,    // AdamW: p *= decay
  kAmsgrad = 1u << 7,      // Adam/AdamW
};

// Tensor k of a launch holds its elements [end of k-1, end of k): threads
// stride over all elements of the launch as one range. `end` is the
// backend's to set.
struct SgdTensor {
  float* param;
  const float* grad;
  float* momentum_buffer;  // null without momentum
  int64_t end;
  float neg_lr, momentum, one_minus_dampening, weight_decay;
  uint32_t flags;
};

// neg_step_size is -lr / bias_correction1 and bias_correction2_sqrt
// sqrt(bias_correction2), per tensor since each counts its own steps.
struct AdamTensor {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  float* max_exp_avg_sq;  // null unless kAmsgrad
  int64_t end;
  float neg_step_size, bias_correction2_sqrt;
  float decay;  // AdamW: 1 - lr * weight_decay
  float weight_decay, beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  uint32_t flags;
};

}  // namespace lockstep::runtime
