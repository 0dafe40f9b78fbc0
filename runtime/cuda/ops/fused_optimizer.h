// Host side of the fused optimizer kernels (kernels/optimizer.h): gathers the
// CUDA parameters of one optimizer step, across all its parameter groups,
// and updates them with one kernel launch per device on that device's
// current stream. The CUDA backend's fused_sgd_step and fused_adam_step
// (runtime/ops/fused_step.h) run on it.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/runtime/cuda/kernels/optimizer.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::cuda {

// The tensors of one fused step. Entry is kernels::SgdTensor or AdamTensor.
template <class Entry>
class FusedLaunch {
 public:
  // Adds a parameter: `entry` holds its pointers (contiguous f32 on the
  // parameter's device, see runtime::check_fusable), flags and coefficients; its
  // `end` is set here. `grad` is kept alive until launch().
  void add(const Tensor& param, const Tensor& grad, Entry entry);
  // One launch per device (the table is copied to the device first); then
  // the step is empty again.
  void launch();
  bool empty() const { return devices_.empty(); }

 private:
  struct OnDevice {
    int device = 0;
    std::vector<Entry> entries;
    int64_t total = 0;
  };
  std::vector<OnDevice> devices_;
  std::vector<Tensor> keep_;  // gradients converted for the step
};

using FusedSgdStep = FusedLaunch<kernels::SgdTensor>;
using FusedAdamStep = FusedLaunch<kernels::AdamTensor>;

// Fused optimizer kernels launched by this process so far (all devices).
int64_t fused_optimizer_launches();

}  // namespace lockstep::runtime::cuda
