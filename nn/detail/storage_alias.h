// Whether a parameter's .grad shares memory with its gradient bucket: the
// reducer's test for a gradient that already is its bucket slot
// (gradient_as_bucket_view), and for one that must be copied out before the
// bucket's memory is reused.
#pragma once

#include "lockstep/runtime/tensor.h"

namespace lockstep::nn::detail {

inline bool same_storage(const runtime::Tensor& a, const runtime::Tensor& b) {
  return a.defined() && b.defined() && a.storage() == b.storage();
}

// `grad` begins where `slot` does, in the same memory.
inline bool is_view_of(const runtime::Tensor& grad, const runtime::Tensor& slot) {
  return same_storage(grad, slot) && grad.storage_offset() == slot.storage_offset();
}

}  // namespace lockstep::nn::detail
