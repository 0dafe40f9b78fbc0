// Linear and Embedding layers, initialised as PyTorch initialises them.
#pragma once

#include <optional>

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

// Embedding(vocab, dim, {.padding_idx = 0}), as nn.Embedding's padding_idx:
// that row starts at zeros and gets no gradient, so it stays as it is set;
// a negative one counts from the end. Must lie in [-num_embeddings,
// num_embeddings).
struct EmbeddingOptions {
  std::optional<int64_t> padding_idx;
};

// Lookup table: indices (i64/i32, any shape) -> [..., embedding_dim].
// Init: weight ~ N(0, 1), as nn.Embedding, then the padding row zeroed.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim,
            Generator& gen = runtime::default_generator());
  Embedding(int64_t num_embeddings, int64_t embedding_dim, EmbeddingOptions options,
            Generator& gen = runtime::default_generator());
  Tensor forward(const Tensor& indices) override;
  std::string type_name() const override { return "Embedding"; }
  std::shared_ptr<Module> replicate() const override;
  std::string extra_repr() const override;

  const int64_t num_embeddings;
  const int64_t embedding_dim;
  const std::optional<int64_t> padding_idx;  // in [0, num_embeddings) once built
  Tensor weight;  // [num_embeddings, embedding_dim]
};

}  // namespace lockstep::nn
