// The CUDA backend's SyncBatchNorm passes (runtime/ops/sync_batch_norm.h):
// the per-channel work before and after nn::SyncBatchNorm's two collectives,
// on kernels/norm.cu. Every buffer that crosses ranks is an f64 tensor on x's
// device.
//
//   forward   local_stats -> all-gather -> combine -> affine
//   backward  grad_sums -> all-reduce (sum) -> grad_input
//
// x and gy are contiguous CUDA tensors [n, c, ...] of f32 or f64; weight,
// bias and the running statistics (each optional) are [c] on the same device,
// weight and bias of x's dtype. Everything is queued on the current stream of
// x's device; nothing waits for the device.
#pragma once

#include "lockstep/runtime/ops/sync_batch_norm.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::cuda::sync_bn {

using runtime::sync_bn::Combined;  // ops/sync_batch_norm.h
using runtime::sync_bn::GradSums;

// This rank's f64 [2c + 1] = [mean | biased var | count] (mean and var 0 when
// the local batch is empty).
Tensor local_stats(const Tensor& x);

// The global statistics from `gathered`, f64 [world * (2c + 1)]: every rank's
// local_stats in rank order. When running_mean/var are defined and the global
// count is > 1, updates them in place with `momentum` and the unbiased
// variance. The count is left on the device: checking it is the caller's.
Combined combine(const Tensor& gathered, int world, DType dtype, const Tensor& weight,
                 const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                 double momentum, double eps);

Tensor affine(const Tensor& x, const Tensor& scale, const Tensor& shift);

// `stats` from combine(). The weight and bias gradients are local (DDP
// averages them); `sums`, summed over ranks, feed grad_input.
GradSums grad_sums(const Tensor& gy, const Tensor& x, const Tensor& stats, bool need_weight,
                   bool need_bias);

// The input gradient from `total`, the sums of grad_sums() summed over ranks.
Tensor grad_input(const Tensor& gy, const Tensor& x, const Tensor& total, const Tensor& stats,
                  const Tensor& weight);

}  // namespace lockstep::runtime::cuda::sync_bn
