#include "gradcheck.h"

#include <cmath>

#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/reduce.h"
#include "lockstep/runtime/random.h"

namespace lockstep::testing {

using namespace lockstep::runtime;

namespace {

double weighted_sum(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                    const std::vector<Tensor>& inputs, const Tensor& v) {
  NoGradGuard no_grad;
  Tensor out = f(inputs).to(DType::f64);
  return sum(mul(out, v)).item();
}

}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs, double eps, double atol,
                          double rtol) {
  Tensor probe;
  {
    NoGradGuard no_grad;
    probe = f(inputs);
  }
  Generator g(1234);
  Tensor v = randn(probe.shape(), DType::f64, g);

  // Analytic: one backward of sum(v * f(x)).
  for (const Tensor& x : inputs)
    if (x.defined() && x.requires_grad()) const_cast<Tensor&>(x).set_grad(Tensor());
  Tensor out = f(inputs);
  if (!out.requires_grad()) return {false, "the function's output does not require grad"};
  out.backward(v.to(out.dtype()));

  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    if (!x.defined() || !x.requires_grad()) continue;
    if (x.dtype() != DType::f64) return {false, fmt::format("input {} is not f64", k)};
    Tensor analytic = x.grad().defined() ? x.grad().contiguous() : Tensor::zeros(x.shape(), DType::f64);
    // Numeric: perturb each element of x in place (x is a leaf; no grad mode).
    Tensor xc = x.detach();
    LOCKSTEP_CHECK(xc.is_contiguous(), "gradcheck: inputs must be contiguous");
    double* p = xc.data_ptr<double>();
    const double* a = analytic.data_ptr<double>();
    for (int64_t j = 0; j < xc.numel(); ++j) {
      const double orig = p[j];
      p[j] = orig + eps;
      double up = weighted_sum(f, inputs, v);
      p[j] = orig - eps;
      double down = weighted_sum(f, inputs, v);
      p[j] = orig;
      double numeric = (up - down) / (2 * eps);
      if (std::abs(numeric - a[j]) > atol + rtol * std::abs(numeric))
        return {false, fmt::format("input {} element {}: analytic {:.8g}, numeric {:.8g}", k, j,
                                   a[j], numeric)};
    }
  }
  return {};
}

Tensor random_input(const Shape& shape, uint64_t seed, double lo, double hi) {
  Generator g(seed);
  Tensor t = Tensor::empty(shape, DType::f64);
  uniform_(t, lo, hi, g);
  t.requires_grad_();
  return t;
}

}  // namespace lockstep::testing
