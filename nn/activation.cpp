#include "lockstep/nn/activation.h"

#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops.h"

namespace lockstep::nn {

Tensor ReLU::forward(const Tensor& x) { return runtime::relu(x); }

Tensor GELU::forward(const Tensor& x) { return runtime::gelu(x); }

Dropout::Dropout(double p_, std::optional<uint64_t> seed)
    : Dropout(p_, std::make_shared<std::optional<Generator>>()) {
  if (seed) generator.emplace(*seed);
}

Dropout::Dropout(double p_, std::shared_ptr<std::optional<Generator>> shared_generator)
    : shared_generator_(std::move(shared_generator)), p(p_), generator(*shared_generator_) {
  LOCKSTEP_CHECK(p_ >= 0.0 && p_ <= 1.0, "Dropout: probability has to be between 0 and 1, got {}",
                 p_);
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
  // The same generator slot, not a copy of it: a copy would draw the very
  // numbers the original draws, the same mask on every replica.
  return std::shared_ptr<Dropout>(new Dropout(p, shared_generator_));
}

}  // namespace lockstep::nn
