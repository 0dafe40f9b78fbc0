// Finite-difference gradient check shared by the op tests.
//
// For f: inputs -> output, picks a fixed random weight v of the output's shape
// and compares, for every element x_j of every input that requires grad, the
// analytic d(sum(v * f))/dx_j from backward() with the central difference
// (L(x_j + eps) - L(x_j - eps)) / (2 eps). Inputs should be f64.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "lockstep/runtime/tensor.h"

namespace lockstep::testing {

using runtime::Tensor;

struct GradcheckResult {
  bool ok = true;
  std::string message;  // the first mismatch: input, element, analytic, numeric
};

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs, double eps = 1e-6,
                          double atol = 1e-5, double rtol = 1e-4);

// Random f64 tensor with requires_grad set, values uniform in [lo, hi).
Tensor random_input(const runtime::Shape& shape, uint64_t seed, double lo = -1.0,
                    double hi = 1.0);

}  // namespace lockstep::testing

// Catch2 usage:  auto r = gradcheck(f, {x, w});  INFO(r.message); CHECK(r.ok);
