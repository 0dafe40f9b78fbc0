// Parameter-free layers: ReLU, GELU, Dropout, Flatten.
#pragma once

#include <optional>

#include "lockstep/nn/module.h"

namespace lockstep::nn {

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "ReLU"; }
  std::shared_ptr<Module> replicate() const override;
};

// The exact (erf) form, PyTorch's default approximate='none'.
class GELU : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "GELU"; }
  std::shared_ptr<Module> replicate() const override;
};

// In training, zeroes each element with probability p and scales the rest by
// 1/(1-p); identity in eval. The mask is drawn from the layer's own generator
// when given a seed, else from runtime::default_generator().
//
// A replica (replicate(), DataParallel) draws from the very generator of the
// layer it was made from, not a copy: the replicas' masks come from disjoint
// stretches of that one seeded stream (as replicas of an unseeded layer share
// the default generator), and reseeding or restoring the original's
// generator reaches them. Which replica takes which stretch follows the order
// in which their threads draw.
class Dropout : public Module {
 private:
  // The generator slot, shared by a layer and its replicas (declared first:
  // `generator` below refers into it).
  std::shared_ptr<std::optional<Generator>> shared_generator_;

 public:
  explicit Dropout(double p = 0.5, std::optional<uint64_t> seed = std::nullopt);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Dropout"; }
  std::shared_ptr<Module> replicate() const override;
  std::string extra_repr() const override;

  const double p;
  // Public so it can be saved, reseeded or set (emplace, reset); shared with
  // the layer's replicas.
  std::optional<Generator>& generator;

 private:
  Dropout(double p, std::shared_ptr<std::optional<Generator>> shared_generator);
};

// Flattens dims start_dim..end_dim into one; PyTorch's defaults keep the batch dim.
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Flatten"; }
  std::shared_ptr<Module> replicate() const override;
  std::string extra_repr() const override;

  const int64_t start_dim;
  const int64_t end_dim;
};

}  // namespace lockstep::nn
