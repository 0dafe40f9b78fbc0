#include "lockstep/runtime/ops/detail/reduced_float.h"

namespace lockstep::runtime::detail {

std::optional<DType> cpu_reduced_dtype(std::initializer_list<Tensor> inputs) {
  for (const Tensor& t : inputs)
    if (t.defined() && t.device().is_cpu() && is_reduced_float(t.dtype())) return t.dtype();
  return std::nullopt;
}

std::vector<Tensor> widened(std::initializer_list<Tensor> inputs) {
  std::vector<Tensor> out;
  out.reserve(inputs.size());
  for (const Tensor& t : inputs)
    out.push_back(t.defined() && is_reduced_float(t.dtype()) ? t.to(DType::f32) : t);
  return out;
}

}  // namespace lockstep::runtime::detail
