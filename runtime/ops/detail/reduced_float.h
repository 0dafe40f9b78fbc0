// Internal: bf16 and f16 on the CPU for ops without a 16-bit CPU kernel.
//
// On the CPU the 16-bit floats are storage types (half.h). Such an op runs in
// f32 on widened copies of its inputs and rounds its result back, which is
// what a 16-bit kernel accumulating in f32 computes. The casts are recorded,
// so each gradient arrives in its input's dtype.
//
//   if (auto low = detail::cpu_reduced_dtype({x, w}))
//     return detail::in_f32(*low, {x, w}, [&](const auto& in) { return op(in[0], in[1]); });
#pragma once

#include <initializer_list>
#include <optional>
#include <vector>

#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::detail {

// The first bf16 or f16 dtype among `inputs` when they are on the CPU;
// nullopt when the op runs as it is.
std::optional<DType> cpu_reduced_dtype(std::initializer_list<Tensor> inputs);

// `inputs` with bf16 and f16 tensors widened to f32; the rest as they are.
std::vector<Tensor> widened(std::initializer_list<Tensor> inputs);

// op(widened inputs) rounded to `low`. The op runs without autocast: its
// policy already chose this dtype, and would otherwise narrow them again.
template <class Op>
Tensor in_f32(DType low, std::initializer_list<Tensor> inputs, Op op) {
  AutocastGuard no_autocast(AutocastState{});
  return op(widened(inputs)).to(low);
}

}  // namespace lockstep::runtime::detail
