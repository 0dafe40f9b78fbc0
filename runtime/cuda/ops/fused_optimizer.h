// Host side of the fused optimizer kernels (kernels/optimizer.h): collects
// the parameters of a step into tables of up to kMaxFusedTensors and launches
// one kernel per table on the current stream of their device. optim/SGD and
// optim/Adam use it for parameters on CUDA.
#pragma once

#include <array>
#include <vector>

#include "lockstep/runtime/cuda/kernels/optimizer.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::cuda {

// One parameter of a fused step: contiguous f32 tensors of one shape on one
// CUDA device. `state` holds the optimizer's tensors in the kernel's order
// (undefined where unused); `coef` the per-tensor coefficients.
struct FusedParam {
  Tensor param, grad;
  std::array<Tensor, 3> state;
  std::array<float, 2> coef{};
};

void fused_sgd_step(const std::vector<FusedParam>& params, const kernels::SgdCoefficients& c);
void fused_adam_step(const std::vector<FusedParam>& params, const kernels::AdamCoefficients& c);

// Throws naming `optimizer` unless `t` suits a fused step: f32, contiguous,
// on a CUDA device.
void check_fusable(const char* optimizer, const char* what, const Tensor& t);

}  // namespace lockstep::runtime::cuda
