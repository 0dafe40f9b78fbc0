// The per-channel passes of nn::SyncBatchNorm around its two collectives, for
// every device (runtime cannot see the process group; nn issues the
// collectives between these calls). Every buffer that crosses ranks is an f64
// tensor on x's device.
//
//   forward   local_stats -> all-gather -> combine -> affine
//   backward  grad_sums -> all-reduce (sum) -> grad_input
//
// x and gy are contiguous [n, c, ...] of f32 or f64; weight, bias and the
// running statistics (each optional) are [c] on x's device, weight and bias
// of x's dtype. Off the CPU the work is queued on the device's current stream
// and nothing waits for the device.
#pragma once

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::sync_bn {

// This rank's f64 [2c + 1] = [mean | biased var | count] (mean and var 0 when
// the local batch is empty).
Tensor local_stats(const Tensor& x);

struct Combined {
  Tensor stats;         // f64 [2c + 1]: [global mean | invstd | global count]
  Tensor scale, shift;  // [c], x's dtype: y = x * scale + shift
};

// The global statistics from `gathered`, f64 [world * (2c + 1)]: every rank's
// local_stats in rank order. When running_mean/var are defined and the global
// count is > 1, updates them in place with `momentum` and the unbiased
// variance. Checking the count (in stats) is the caller's.
Combined combine(const Tensor& gathered, int world, DType dtype, const Tensor& weight,
                 const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                 double momentum, double eps);

Tensor affine(const Tensor& x, const Tensor& scale, const Tensor& shift);

struct GradSums {
  Tensor sums;                    // f64 [2c]: [sum(gy) | sum(gy * (x - mean))], this rank's
  Tensor grad_weight, grad_bias;  // [c], x's dtype; defined when asked for
};

// `stats` from combine(). The weight and bias gradients are local (DDP
// averages them); `sums`, summed over ranks, feed grad_input.
GradSums grad_sums(const Tensor& gy, const Tensor& x, const Tensor& stats, bool need_weight,
                   bool need_bias);

// The input gradient from `total`, the sums of grad_sums() summed over ranks.
Tensor grad_input(const Tensor& gy, const Tensor& x, const Tensor& total, const Tensor& stats,
                  const Tensor& weight);

}  // namespace lockstep::runtime::sync_bn
