#include "lockstep/runtime/ops/running_stats.h"

#include <vector>

#include "lockstep/runtime/autograd/grad_mode.h"

namespace lockstep::runtime {

void update_running_stats(const Tensor& running_mean, const Tensor& running_var,
                          const double* mean, const double* var, int64_t count, double momentum) {
  NoGradGuard no_grad;
  const int64_t c = running_mean.numel();
  const double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
  std::vector<double> rm = running_mean.detach().to_vector<double>();
  std::vector<double> rv = running_var.detach().to_vector<double>();
  for (int64_t i = 0; i < c; ++i) {
    rm[i] = (1 - momentum) * rm[i] + momentum * mean[i];
    rv[i] = (1 - momentum) * rv[i] + momentum * var[i] * unbias;
  }
  Tensor(running_mean).copy_(Tensor::from_vector(rm, {c}));
  Tensor(running_var).copy_(Tensor::from_vector(rv, {c}));
}

}  // namespace lockstep::runtime
