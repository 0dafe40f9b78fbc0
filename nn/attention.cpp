#include "lockstep/nn/attention.h"

#include <fmt/format.h>

#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops.h"

namespace lockstep::nn {

MultiheadSelfAttention::MultiheadSelfAttention(int64_t embed_dim, int64_t num_heads,
                                               SelfAttentionOptions options, Generator& gen)
    : embed_dim(embed_dim), num_heads(num_heads), options(options) {
  LOCKSTEP_CHECK(embed_dim > 0 && num_heads > 0 && embed_dim % num_heads == 0,
                 "MultiheadSelfAttention: embed_dim ({}) must be a positive multiple of "
                 "num_heads ({})",
                 embed_dim, num_heads);
  LOCKSTEP_CHECK(options.dropout >= 0.0 && options.dropout < 1.0,
                 "MultiheadSelfAttention: dropout {} must be in [0, 1)", options.dropout);
  register_module("c_attn", std::make_shared<Linear>(embed_dim, 3 * embed_dim, options.bias, gen),
                  c_attn);
  register_module("c_proj", std::make_shared<Linear>(embed_dim, embed_dim, options.bias, gen),
                  c_proj);
}

Tensor MultiheadSelfAttention::forward(const Tensor& x) { return attend(x, Tensor()); }

Values MultiheadSelfAttention::forward_values(const Values& inputs) {
  return {attend(inputs.tensor(0), inputs.optional_tensor(1))};
}

Tensor MultiheadSelfAttention::attend(const Tensor& x, const Tensor& mask) {
  LOCKSTEP_CHECK(x.dim() == 3 && x.size(2) == embed_dim,
                 "MultiheadSelfAttention(embed_dim={}): input of shape {} must be [B, T, {}]",
                 embed_dim, runtime::shape_str(x.shape()), embed_dim);
  const Tensor qkv = (*c_attn)(x);  // [B, T, 3C]
  Generator& g = options.generator ? *options.generator : runtime::default_generator();
  const double p = is_training() ? options.dropout : 0.0;
  const Tensor y = runtime::attention_from_qkv(  // [B, T, C]: the heads side by side
      qkv, num_heads, {.mask = mask, .causal = options.causal, .dropout = p, .generator = &g});
  Tensor out = (*c_proj)(y);
  return runtime::dropout(out, options.dropout, is_training(), g);
}

std::shared_ptr<Module> MultiheadSelfAttention::replicate() const {
  Generator unused;
  return std::make_shared<MultiheadSelfAttention>(embed_dim, num_heads, options, unused);
}

std::string MultiheadSelfAttention::extra_repr() const {
  return fmt::format("embed_dim={}, num_heads={}, causal={}, dropout={}", embed_dim, num_heads,
                     options.causal, options.dropout);
}

}  // namespace lockstep::nn
