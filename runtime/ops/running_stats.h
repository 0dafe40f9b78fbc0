// Batch norm's running statistics, updated on the host for the CPU ops
// (batch_norm and SyncBatchNorm; cuDNN updates its own on CUDA).
#pragma once

#include <cstdint>

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

// running = (1 - momentum) * running + momentum * batch, per channel, with the
// unbiased batch variance var * count / (count - 1), as PyTorch. mean and var
// are the batch's [c] (var biased); count > 1 values per channel. In place
// (copy_ bumps the buffers' versions) and off the autograd tape.
void update_running_stats(const Tensor& running_mean, const Tensor& running_var,
                          const double* mean, const double* var, int64_t count, double momentum);

}  // namespace lockstep::runtime
