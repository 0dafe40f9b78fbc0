// Small helpers shared by the nn and optim tests.
#pragma once

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/runtime/error.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::testing {

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

inline double max_abs_diff(const runtime::Tensor& a, const runtime::Tensor& b) {
  auto x = values(a), y = values(b);
  double m = x.size() == y.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

inline bool bitwise_equal(const runtime::Tensor& a, const runtime::Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && values(a) == values(b);
}

}  // namespace lockstep::testing
