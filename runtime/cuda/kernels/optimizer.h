// Fused optimizer updates: one kernel launch steps every f32 parameter of a
// device (SGD with momentum, Adam/AdamW), whatever their number and their
// parameter groups. The launch reads a table of tensors from device memory:
// one entry per tensor with its pointers, its place in the launch and its
// coefficients (so groups with different options share the launch). The
// host fills the table in pinned memory and copies it asynchronously on the
// launch's stream, so the host never waits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "lockstep/runtime/ops/fused_step_entries.h"

namespace lockstep::runtime::cuda::kernels {

using runtime::AdamTensor;
using runtime::SgdTensor;
using runtime::kAmsgrad;
using runtime::kDecoupled;
using runtime::kFirstStep;
using runtime::kL2;
using runtime::kMaximize;
using runtime::kMomentum;
using runtime::kNesterov;
using runtime::kWeightDecay;

// `table` is `count` entries in device memory; `total` the end of the last.
cudaError_t sgd_step(const SgdTensor* table, int count, int64_t total, cudaStream_t stream);
cudaError_t adam_step(const AdamTensor* table, int count, int64_t total, cudaStream_t stream);

}  // namespace lockstep::runtime::cuda::kernels
