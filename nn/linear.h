// Linear and Embedding layers, initialised as PyTorch initialises them.
#pragma once

#include "lockstep/nn/module.h"

namespace lockstep::nn {

// y = x W^T + b; x [..., in_features] -> [..., out_features].
// Init (nn.Linear.reset_parameters): W ~ kaiming_uniform(a = sqrt(5)), i.e.
// U(-1/sqrt(in), 1/sqrt(in)); b ~ U(-1/sqrt(in), 1/sqrt(in)). W drawn first.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true,
         Generator& gen = runtime::default_generator());
  // A Linear over `weight` [out, in] and `bias` [out] (or none) as given,
  // shared with whoever else holds them: weight tying, as PyTorch's
  // `lm_head.weight = wte.weight`.
  explicit Linear(Tensor weight, Tensor bias = {});
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Linear"; }
  std::shared_ptr<Module> replicate() const override;
  std::string extra_repr() const override;

  const int64_t in_features;
  const int64_t out_features;
  Tensor weight;  // [out_features, in_features]
  Tensor bias;    // [out_features], undefined without bias
};

// Lookup table: indices (i64/i32, any shape) -> [..., embedding_dim].
// Init: weight ~ N(0, 1), as nn.Embedding.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim,
            Generator& gen = runtime::default_generator());
  Tensor forward(const Tensor& indices) override;
  std::string type_name() const override { return "Embedding"; }
  std::shared_ptr<Module> replicate() const override;
  std::string extra_repr() const override;

  const int64_t num_embeddings;
  const int64_t embedding_dim;
  Tensor weight;  // [num_embeddings, embedding_dim]
};

}  // namespace lockstep::nn
