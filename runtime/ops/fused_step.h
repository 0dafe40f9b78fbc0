// Fused optimizer steps off the CPU: optim/SGD and optim/Adam describe each
// device parameter's update as an entry (pointers, flags, coefficients) and
// hand them all to the parameters' device backend at once, which steps every
// parameter of a device with one kernel launch, whatever their number and
// their parameter groups (device_backend.h: fused_sgd_step, fused_adam_step).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "lockstep/runtime/ops/fused_step_entries.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

// A parameter of a fused step: `grad` (contiguous, of param's dtype) is kept
// alive until the launch has read it.
template <class Entry>
struct FusedParam {
  Tensor param;
  Tensor grad;
  Entry entry;
};

// The device parameters of one optimizer step, across all its groups.
template <class Entry>
class FusedStep {
 public:
  void add(const Tensor& param, const Tensor& grad, Entry entry) {
    params_.push_back({param, grad, entry});
  }
  // Hands every parameter to its device backend; then the step is empty.
  void launch();

 private:
  std::vector<FusedParam<Entry>> params_;
};

// The data of `t` as an entry's pointer: null when `t` is undefined (a
// state tensor the step does not use).
inline float* fused_data(const Tensor& t) {
  return t.defined() ? static_cast<float*>(t.raw_data()) : nullptr;
}

// Throws naming `optimizer` unless `t` suits a fused step: f32, contiguous,
// off the CPU.
void check_fusable(const char* optimizer, const char* what, const Tensor& t);
// The same for each of `keys` present in a parameter's `state` (may be null).
void check_fusable_state(const char* optimizer, const std::map<std::string, Tensor>* state,
                         std::initializer_list<const char*> keys);

}  // namespace lockstep::runtime
