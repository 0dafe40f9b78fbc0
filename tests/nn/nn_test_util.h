// Small helpers shared by the nn and optim tests.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "lockstep/runtime/error.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::nn_testing {

// The message of the lockstep::Error that fn throws, or "" if it throws none.
inline std::string error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

inline std::vector<double> values(const runtime::Tensor& t) {
  return t.detach().to_vector<double>();
}

// Through double, which holds every f32 value exactly: equal means bit-identical
// (for non-NaN values).
inline bool bitwise_equal(const runtime::Tensor& a, const runtime::Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && values(a) == values(b);
}

}  // namespace lockstep::nn_testing
