// Host side of the fused optimizer kernels (kernels/optimizer.h): gathers the
// CUDA parameters of one optimizer step, across all its parameter groups,
// and updates them with one kernel launch per device on that device's
// current stream. optim/SGD and optim/Adam use it.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "lockstep/runtime/cuda/kernels/optimizer.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::cuda {

// The tensors of one fused step. Entry is kernels::SgdTensor or AdamTensor.
template <class Entry>
class FusedStep {
 public:
  // Adds a parameter: `entry` holds its pointers (contiguous f32 on the
  // parameter's device, see check_fusable), flags and coefficients; its
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

using FusedSgdStep = FusedStep<kernels::SgdTensor>;
using FusedAdamStep = FusedStep<kernels::AdamTensor>;

// The data of `t` as a table entry's pointer: null when `t` is undefined (a
// state tensor the step does not use).
inline float* fused_data(const Tensor& t) {
  return t.defined() ? static_cast<float*>(t.raw_data()) : nullptr;
}

// Fused optimizer kernels launched by this process so far (all devices).
int64_t fused_optimizer_launches();

// Throws naming `optimizer` unless `t` suits a fused step: f32, contiguous,
// on a CUDA device.
void check_fusable(const char* optimizer, const char* what, const Tensor& t);
// The same for each of `keys` present in a parameter's `state` (may be null).
void check_fusable_state(const char* optimizer, const std::map<std::string, Tensor>* state,
                         std::initializer_list<const char*> keys);

}  // namespace lockstep::runtime::cuda
