#include "lockstep/nn/activation.h"

#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops.h"

namespace lockstep::nn {

Tensor ReLU::forward(const Tensor& x) { return runtime::relu(x); }

Tensor GELU::forward(const Tensor& x) { return runtime::gelu(x); }

Dropout::Dropout(double p_, std::optional<uint64_t> seed) : p(p_) {
  LOCKSTEP_CHECK(p_ >= 0.0 && p_ <= 1.0, "Dropout: probability has to be between 0 and 1, got {}",
                 p_);
  if (seed) generator.emplace(*seed);
}

Tensor Dropout::forward(const Tensor& x) {
  return runtime::dropout(x, p, is_training(),
                          generator ? *generator : runtime::default_generator());
}

std::string Dropout::extra_repr() const { return fmt::format("p={}", p); }

Tensor Flatten::forward(const Tensor& x) { return x.flatten(start_dim, end_dim); }

std::string Flatten::extra_repr() const {
  return fmt::format("start_dim={}, end_dim={}", start_dim, end_dim);
}

std::shared_ptr<Module> ReLU::replicate() const { return std::make_shared<ReLU>(); }
std::shared_ptr<Module> GELU::replicate() const { return std::make_shared<GELU>(); }
std::shared_ptr<Module> Flatten::replicate() const {
  return std::make_shared<Flatten>(start_dim, end_dim);
}
std::shared_ptr<Module> Dropout::replicate() const {
  auto copy = std::make_shared<Dropout>(p);
  copy->generator = generator;
  return copy;
}

}  // namespace lockstep::nn
