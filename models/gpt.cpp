#include "lockstep/models/gpt.h"

#include <algorithm>
#include <cmath>

#include "lockstep/runtime/autograd/checkpoint.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops.h"

namespace lockstep::models {

using namespace nn;

GptConfig GptConfig::gpt2() { return {}; }
GptConfig GptConfig::gpt2_medium() { return {.n_layer = 24, .n_head = 16, .n_embd = 1024}; }
GptConfig GptConfig::gpt2_large() { return {.n_layer = 36, .n_head = 20, .n_embd = 1280}; }

int64_t GptConfig::num_parameters() const {
  const int64_t c = n_embd;
  const int64_t b = bias ? 1 : 0;  // biases of the Linears and LayerNorms
  const int64_t per_block = 2 * (1 + b) * c            // ln_1, ln_2
                            + (3 * c * c + 3 * c * b)  // attn.c_attn
                            + (c * c + c * b)          // attn.c_proj
                            + (4 * c * c + 4 * c * b)  // mlp.c_fc
                            + (4 * c * c + c * b);     // mlp.c_proj
  return vocab_size * c + block_size * c + n_layer * per_block + (1 + b) * c;
}

namespace {

void check_config(const GptConfig& c) {
  LOCKSTEP_CHECK(c.vocab_size > 0 && c.block_size > 0 && c.n_layer > 0 && c.n_head > 0 &&
                     c.n_embd > 0 && c.n_embd % c.n_head == 0,
                 "GPT: vocab_size ({}), block_size ({}), n_layer ({}), n_head ({}) and n_embd ({}) "
                 "must be positive, n_embd a multiple of n_head",
                 c.vocab_size, c.block_size, c.n_layer, c.n_head, c.n_embd);
  LOCKSTEP_CHECK(c.dropout >= 0.0 && c.dropout < 1.0, "GPT: dropout {} must be in [0, 1)",
                 c.dropout);
}

std::shared_ptr<LayerNorm> layer_norm(const GptConfig& c) {
  return std::make_shared<LayerNorm>(std::vector<int64_t>{c.n_embd}, 1e-5, true, c.bias);
}

void init_linear(Linear& l, double std, Generator& g) {
  runtime::NoGradGuard no_grad;
  runtime::normal_(l.weight, 0.0, std, g);
  if (l.bias.defined()) l.bias.zero_();
}

}  // namespace

GptMlp::GptMlp(const GptConfig& config, Generator& gen) : config(config) {
  const int64_t c = config.n_embd;
  register_module("c_fc", std::make_shared<Linear>(c, 4 * c, config.bias, gen), c_fc);
  register_module("c_proj", std::make_shared<Linear>(4 * c, c, config.bias, gen), c_proj);
}

Tensor GptMlp::forward(const Tensor& x) {
  return runtime::dropout((*c_proj)(runtime::gelu((*c_fc)(x))), config.dropout, is_training());
}

std::shared_ptr<Module> GptMlp::replicate() const {
  Generator unused;
  return std::make_shared<GptMlp>(config, unused);
}

GptBlock::GptBlock(const GptConfig& config, Generator& gen) : config(config) {
  register_module("ln_1", layer_norm(config), ln_1);
  register_module("attn",
                  std::make_shared<MultiheadSelfAttention>(
                      config.n_embd, config.n_head,
                      SelfAttentionOptions{
                          .causal = true, .dropout = config.dropout, .bias = config.bias}, gen),
                  attn);
  register_module("ln_2", layer_norm(config), ln_2);
  register_module("mlp", std::make_shared<GptMlp>(config, gen), mlp);
}

Tensor GptBlock::forward(const Tensor& x) {
  if (!config.checkpoint_blocks) return body(x);
  return runtime::checkpoint([this](const Tensor& in) { return body(in); }, x);
}

Tensor GptBlock::body(const Tensor& x) {
  const Tensor y = runtime::add(x, (*attn)((*ln_1)(x)));
  return runtime::add(y, (*mlp)((*ln_2)(y)));
}

std::shared_ptr<Module> GptBlock::replicate() const {
  Generator unused;
  return std::make_shared<GptBlock>(config, unused);
}

Gpt::Gpt(GptConfig cfg, Generator& gen) : config(cfg) {
  check_config(config);
  const int64_t c = config.n_embd;
  register_module("transformer", std::make_shared<ModuleDict>(), transformer);
  const auto wte =
      transformer->insert("wte", std::make_shared<Embedding>(config.vocab_size, c, gen));
  const auto wpe =
      transformer->insert("wpe", std::make_shared<Embedding>(config.block_size, c, gen));
  const auto h = transformer->insert("h", std::make_shared<Sequential>());
  for (int64_t i = 0; i < config.n_layer; ++i) h->push_back(std::make_shared<GptBlock>(config, gen));
  transformer->insert("ln_f", layer_norm(config));
  // What forward() calls them as: replace_child on transformer refuses other kinds.
  transformer->require_child_type<Embedding>("wte", type_name());
  transformer->require_child_type<Embedding>("wpe", type_name());
  transformer->require_child_type<Sequential>("h", type_name());
  transformer->require_child_type<LayerNorm>("ln_f", type_name());
  register_module("lm_head", std::make_shared<Linear>(wte->weight), lm_head);

  // nanoGPT's initialisation, in its module order.
  runtime::NoGradGuard no_grad;
  runtime::normal_(wte->weight, 0.0, 0.02, gen);
  runtime::normal_(wpe->weight, 0.0, 0.02, gen);
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  for (size_t i = 0; i < h->size(); ++i) {
    const auto block = h->at<GptBlock>(i);
    init_linear(*block->attn->c_attn, 0.02, gen);
    init_linear(*block->attn->c_proj, residual_std, gen);
    init_linear(*block->mlp->c_fc, 0.02, gen);
    init_linear(*block->mlp->c_proj, residual_std, gen);
  }
}

std::shared_ptr<Embedding> Gpt::wte() const { return transformer->child<Embedding>("wte"); }
std::shared_ptr<Embedding> Gpt::wpe() const { return transformer->child<Embedding>("wpe"); }
std::shared_ptr<Sequential> Gpt::h() const { return transformer->child<Sequential>("h"); }
std::shared_ptr<LayerNorm> Gpt::ln_f() const { return transformer->child<LayerNorm>("ln_f"); }

Tensor Gpt::forward(const Tensor& idx) {
  LOCKSTEP_CHECK(idx.dim() == 2 && (idx.dtype() == DType::i64 || idx.dtype() == DType::i32),
                 "GPT: token ids must be an integer tensor [B, T], got {} {}",
                 runtime::shape_str(idx.shape()), runtime::dtype_name(idx.dtype()));
  const int64_t t = idx.size(1);
  LOCKSTEP_CHECK(t >= 1, "GPT: the token ids {} hold no tokens; give at least one per sequence",
                 runtime::shape_str(idx.shape()));
  LOCKSTEP_CHECK(t <= config.block_size,
                 "GPT: a sequence of {} tokens does not fit block_size {}; pass at most {} (crop "
                 "the context to its last block_size tokens)",
                 t, config.block_size, config.block_size);
  const Tensor positions = Tensor::arange(t).to(idx.device());
  Tensor x = runtime::add((*wte())(idx), (*wpe())(positions));
  x = runtime::dropout(x, config.dropout, is_training());
  x = (*ln_f())((*h())(x));
  return (*lm_head)(x);
}

Values Gpt::forward_values(const Values& inputs) {
  const Tensor& idx = inputs.tensor(0);
  const Tensor logits = forward(idx);
  const Tensor targets = inputs.optional_tensor(1);
  if (!targets.defined()) return {logits, Value{}};
  LOCKSTEP_CHECK(targets.shape() == idx.shape(),
                 "GPT: targets {} must have the shape of the token ids {}",
                 runtime::shape_str(targets.shape()), runtime::shape_str(idx.shape()));
  const int64_t rows = idx.numel();
  // Targets of -1 are skipped, as nanoGPT's ignore_index=-1.
  const Tensor loss = runtime::cross_entropy(logits.reshape({rows, config.vocab_size}),
                                             targets.reshape({rows}), 0.0,
                                             runtime::Reduction::Mean, -1);
  return {logits, loss};
}

std::shared_ptr<Module> Gpt::replicate() const {
  Generator unused;
  return std::make_shared<Gpt>(config, unused);
}

std::vector<int64_t> sample(Gpt& model, const std::vector<int64_t>& prompt, int64_t count,
                            Generator& g, SampleOptions options) {
  LOCKSTEP_CHECK(!prompt.empty(), "sample: the prompt is empty; give at least one token");
  LOCKSTEP_CHECK(options.temperature > 0.0, "sample: temperature {} must be positive",
                 options.temperature);
  LOCKSTEP_CHECK(options.top_k >= 0, "sample: top_k {} must be 0 (every token) or positive",
                 options.top_k);
  const int64_t vocab = model.config.vocab_size;
  for (const int64_t token : prompt) {
    LOCKSTEP_CHECK(token >= 0 && token < vocab, "sample: prompt token {} is outside [0, {})",
                   token, vocab);
  }
  const Device device = model.wte()->weight.device();
  runtime::NoGradGuard no_grad;
  std::vector<int64_t> tokens = prompt, out;
  for (int64_t n = 0; n < count; ++n) {
    const int64_t context = std::min<int64_t>(static_cast<int64_t>(tokens.size()),
                                              model.config.block_size);
    const std::vector<int64_t> window(tokens.end() - context, tokens.end());
    const Tensor logits = model(Tensor::from_vector(window, {1, context}).to(device));
    std::vector<double> p = logits.select(1, context - 1).to_vector<double>();
    // A NaN would fail every comparison below and pick the last token each time.
    const auto bad = std::find_if(p.begin(), p.end(), [](double v) { return !std::isfinite(v); });
    LOCKSTEP_CHECK(bad == p.end(),
                   "sample: the model gives logit {} to token {} when sampling token {} of {}; "
                   "logits must be finite (NaN weights: did training diverge?)",
                   *bad, bad - p.begin(), n + 1, count);
    // Softmax of logits / temperature over the top k.
    std::vector<double> sorted = p;
    const int64_t k = options.top_k > 0 ? std::min(options.top_k, vocab) : vocab;
    std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<>());
    const double cutoff = sorted[static_cast<size_t>(k - 1)];
    const double top = *std::max_element(p.begin(), p.end());
    double total = 0;
    for (double& v : p) {
      v = v < cutoff ? 0.0 : std::exp((v - top) / options.temperature);
      total += v;
    }
    double u = g.next_uniform() * total;
    int64_t next = -1;
    for (int64_t i = 0; i < vocab; ++i) {
      if (p[static_cast<size_t>(i)] == 0.0) continue;
      next = i;  // rounding may leave u >= 0 past the end: the last candidate then
      u -= p[static_cast<size_t>(i)];
      if (u < 0) break;
    }
    tokens.push_back(next);
    out.push_back(next);
  }
  return out;
}

}  // namespace lockstep::models
