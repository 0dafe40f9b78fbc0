#include "lockstep/runtime/ops/fused_step.h"

#include "lockstep/runtime/device_backend.h"

namespace lockstep::runtime {
namespace {

void launch_on(const DeviceBackend& backend, const std::vector<FusedParam<SgdTensor>>& params) {
  backend.fused_sgd_step(params);
}
void launch_on(const DeviceBackend& backend, const std::vector<FusedParam<AdamTensor>>& params) {
  backend.fused_adam_step(params);
}

}  // namespace

template <class Entry>
void FusedStep<Entry>::launch() {
  if (params_.empty()) return;
  // One backend for every device of a kind (it launches per device).
  launch_on(device_backend(params_.front().param.device()), params_);
  params_.clear();  // the backend freed nothing early: tensors go in stream order
}

template class FusedStep<SgdTensor>;
template class FusedStep<AdamTensor>;

void check_fusable(const char* optimizer, const char* what, const Tensor& t) {
  LOCKSTEP_CHECK(!t.device().is_cpu() && t.dtype() == DType::f32 && t.is_contiguous(),
                 "{}: the CUDA update takes contiguous f32 tensors; the {} is {} on {}{} (keep "
                 "parameters in f32 on CUDA, e.g. with .to(DType::f32))",
                 optimizer, what, dtype_name(t.dtype()), t.device().str(),
                 t.is_contiguous() ? "" : " and not contiguous");
}

void check_fusable_state(const char* optimizer, const std::map<std::string, Tensor>* state,
                         std::initializer_list<const char*> keys) {
  if (state == nullptr) return;
  for (const char* key : keys) {
    const auto it = state->find(key);
    if (it != state->end()) check_fusable(optimizer, key, it->second);
  }
}

}  // namespace lockstep::runtime
