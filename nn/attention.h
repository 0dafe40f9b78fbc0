// MultiheadSelfAttention: x [B, T, C] -> [B, T, C], with one fused
// projection to queries, keys and values (c_attn, [3C, C]) and an output
// projection (c_proj), as nanoGPT's CausalSelfAttention, so parameter names
// match it: "c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias".
//
//   y = c_proj(sdpa(q, k, v)) with q, k, v = split(c_attn(x)) into C / H per head
//
// forward_values({x, mask}) takes an attention mask as scaled_dot_product_
// attention does (bool, true = may attend, broadcastable to [B, H, T, T]);
// with `causal` set, the mask must be left out. Dropout on the attention
// weights and on the output in training only, drawn from `generator`
// (default_generator() when null).
#pragma once

#include <memory>

#include "lockstep/nn/linear.h"
#include "lockstep/nn/module.h"

namespace lockstep::nn {

struct SelfAttentionOptions {
  bool causal = true;
  double dropout = 0.0;  // on the attention weights and on the output
  bool bias = true;      // of both projections
  Generator* generator = nullptr;
};

class MultiheadSelfAttention : public Module {
 public:
  MultiheadSelfAttention(int64_t embed_dim, int64_t num_heads, SelfAttentionOptions options = {},
                         Generator& gen = runtime::default_generator());
  Tensor forward(const Tensor& x) override;
  Values forward_values(const Values& inputs) override;
  std::string type_name() const override { return "MultiheadSelfAttention"; }
  std::shared_ptr<Module> replicate() const override;
  std::string extra_repr() const override;

  const int64_t embed_dim;
  const int64_t num_heads;
  const SelfAttentionOptions options;
  // Bound to the registered children (Module::bind_child).
  std::shared_ptr<Linear> c_attn;  // [3C, C]: queries, keys, values in that order
  std::shared_ptr<Linear> c_proj;  // [C, C]

 private:
  Tensor attend(const Tensor& x, const Tensor& mask);
};

}  // namespace lockstep::nn
