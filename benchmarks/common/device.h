// The few CUDA steps a benchmark needs besides choosing its device
// (distributed/device_select.h): waiting for the GPU before reading the clock,
// naming it in the results, TF32. Builds with and without CUDA; on the CPU the
// CUDA-only steps are no-ops.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lockstep/collectives/process_group.h"
#include "lockstep/runtime/dtype.h"

namespace lockstep::bench {

// Blocks the host until every stream of `device` is idle (cudaDeviceSynchronize):
// kernels are asynchronous, so a step timed without it measures the launches
// only. No-op on the CPU.
void synchronize(const runtime::Device& device);

// The GPU's name (cudaGetDeviceProperties), e.g. "NVIDIA H100 80GB HBM3"; empty on the CPU.
std::string device_name(const runtime::Device& device);

// bench::machine_description(), plus the GPU's name for a CUDA device.
std::string machine_description(const runtime::Device& device);

// The largest of every rank's `value` (e.g. the slowest rank's step time),
// through a tensor on `device` (NCCL takes CUDA tensors only).
double max_over_ranks(collectives::ProcessGroup& group, double value,
                      const runtime::Device& device = runtime::Device::cpu());

// Every rank's `values` (the same count on each), rank 0's first, through a
// tensor on `device`.
std::vector<double> gather_over_ranks(collectives::ProcessGroup& group,
                                      const std::vector<double>& values,
                                      const runtime::Device& device = runtime::Device::cpu());

// TF32 tensor cores for f32 matmul and convolution (runtime/cuda/ops/math_mode.h).
// Throws when CUDA is not built in and `allow` is true.
void set_allow_tf32(bool allow);

// cuDNN benchmark mode (torch.backends.cudnn.benchmark; runtime/cuda/ops/math_mode.h).
// Throws when CUDA is not built in and `on` is true.
void set_cudnn_benchmark(bool on);

}  // namespace lockstep::bench
