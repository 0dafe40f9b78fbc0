// GPT: a decoder-only transformer as GPT-2, with nanoGPT's parameter names
// ("transformer.wte.weight", "transformer.h.0.attn.c_attn.weight", ...,
// "lm_head.weight"), so weights can be exchanged with a nanoGPT model by
// name through state_dict() or safetensors.
//
//   wte: token embedding [V, C]; wpe: learned position embedding [block, C]
//   h.i: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))   (pre-LayerNorm)
//        attn: causal MultiheadSelfAttention; mlp: c_fc [4C, C], GELU, c_proj
//   ln_f, then lm_head [V, C], whose weight IS wte's (tied; listed once by
//   parameters(), under both names by state_dict(), as in PyTorch; a
//   state_dict holding only one of the names, as safetensors' save_model
//   writes it, loads both, and one holding different values under the two,
//   an untied model's, is refused)
//
// Every Linear weight is [out, in], as torch.nn.Linear and nanoGPT's;
// Hugging Face's GPT-2 stores attn.c_attn, attn.c_proj, mlp.c_fc and
// mlp.c_proj as Conv1D, [in, out]: transpose those weights to load them.
//
// Initialised as nanoGPT: every Linear and Embedding weight ~ N(0, 0.02),
// biases 0, each residual projection (c_proj) ~ N(0, 0.02 / sqrt(2 n_layer)).
// Dropout (config.dropout, training only) draws from default_generator().
#pragma once

#include <memory>
#include <vector>

#include "lockstep/nn/activation.h"
#include "lockstep/nn/attention.h"
#include "lockstep/nn/container.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/normalization.h"

namespace lockstep::models {

struct GptConfig {
  int64_t vocab_size = 50257;
  int64_t block_size = 1024;  // the longest sequence
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  double dropout = 0.0;
  // nanoGPT's GPTConfig.bias: false gives every Linear and LayerNorm no bias
  // (a checkpoint trained with nanoGPT's bias=False loads strictly).
  bool bias = true;
  // Recompute each block's activations in backward instead of keeping them
  // (runtime/autograd/checkpoint.h); parameter names do not change.
  bool checkpoint_blocks = false;

  // GPT-2's sizes: 124M, 350M, 774M parameters.
  static GptConfig gpt2();
  static GptConfig gpt2_medium();
  static GptConfig gpt2_large();
  // Every parameter (position embeddings included, the tied weight once).
  int64_t num_parameters() const;
};

// The feed-forward half of a block: c_fc, GELU, c_proj, dropout.
class GptMlp : public nn::Module {
 public:
  GptMlp(const GptConfig& config, runtime::Generator& gen);
  runtime::Tensor forward(const runtime::Tensor& x) override;
  std::string type_name() const override { return "MLP"; }
  std::shared_ptr<nn::Module> replicate() const override;

  const GptConfig config;
  std::shared_ptr<nn::Linear> c_fc, c_proj;  // bound to the children (nn::Module::bind_child)
};

class GptBlock : public nn::Module {
 public:
  GptBlock(const GptConfig& config, runtime::Generator& gen);
  // Checkpointed when config.checkpoint_blocks.
  runtime::Tensor forward(const runtime::Tensor& x) override;
  std::string type_name() const override { return "Block"; }
  std::shared_ptr<nn::Module> replicate() const override;

  const GptConfig config;
  // Bound to the children (nn::Module::bind_child).
  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<nn::MultiheadSelfAttention> attn;
  std::shared_ptr<GptMlp> mlp;

 private:
  runtime::Tensor body(const runtime::Tensor& x);
};

class Gpt : public nn::Module {
 public:
  explicit Gpt(GptConfig config, runtime::Generator& gen = runtime::default_generator());
  // Token ids [B, T] (i64 or i32, T <= block_size) -> logits [B, T, V].
  runtime::Tensor forward(const runtime::Tensor& idx) override;
  // {idx, targets [B, T] (optional)} -> {logits, loss}: the mean
  // cross-entropy over the positions whose target is not -1 (nanoGPT's
  // ignore_index; 0 when every target is -1), in nats, or none without targets.
  nn::Values forward_values(const nn::Values& inputs) override;
  std::string type_name() const override { return "GPT"; }
  std::shared_ptr<nn::Module> replicate() const override;

  const GptConfig config;
  // transformer and lm_head are bound to the children (nn::Module::bind_child);
  // transformer's own children are looked up there at each call, so a
  // replaced one (transformer->replace_child("ln_f", ...)) is the one used.
  std::shared_ptr<nn::ModuleDict> transformer;  // wte, wpe, h, ln_f
  std::shared_ptr<nn::Embedding> wte() const;
  std::shared_ptr<nn::Embedding> wpe() const;
  std::shared_ptr<nn::Sequential> h() const;  // the blocks, "h.0" ... "h.{n_layer-1}"
  std::shared_ptr<nn::LayerNorm> ln_f() const;
  std::shared_ptr<nn::Linear> lm_head;  // no bias; weight tied to wte's
};

struct SampleOptions {
  double temperature = 1.0;  // > 0; lower is more conservative
  int64_t top_k = 0;         // sample among the k likeliest tokens; 0: all
};

// `count` tokens sampled after `prompt` (non-empty), one at a time, each from
// the model's distribution given the last block_size tokens, with `g`. Runs
// without gradients; the caller picks the mode (eval() for no dropout).
// Logits that are not finite (a diverged model) are an error.
std::vector<int64_t> sample(Gpt& model, const std::vector<int64_t>& prompt, int64_t count,
                            runtime::Generator& g, SampleOptions options = {});

}  // namespace lockstep::models
