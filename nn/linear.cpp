#include "lockstep/nn/linear.h"

#include <cmath>

#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops.h"

namespace lockstep::nn {

Linear::Linear(int64_t in, int64_t out, bool with_bias, Generator& gen)
    : in_features(in), out_features(out) {
  LOCKSTEP_CHECK(in >= 0 && out >= 0, "Linear: in_features ({}) and out_features ({}) must be >= 0",
                 in, out);
  Tensor w = Tensor::empty({out, in});
  runtime::kaiming_uniform_(w, std::sqrt(5.0), gen);
  weight = register_parameter("weight", w);
  if (with_bias) {
    // fan_in 0 (an empty layer) gives bound 0, as in PyTorch.
    const double bound = in > 0 ? 1.0 / std::sqrt(static_cast<double>(in)) : 0.0;
    Tensor b = Tensor::empty({out});
    runtime::uniform_(b, -bound, bound, gen);
    bias = register_parameter("bias", b);
  }
}

Linear::Linear(Tensor w, Tensor b)
    : in_features(w.defined() && w.dim() == 2 ? w.size(1) : 0),
      out_features(w.defined() && w.dim() == 2 ? w.size(0) : 0) {
  LOCKSTEP_CHECK(w.defined() && w.dim() == 2, "Linear: the weight given must be a 2-D tensor "
                 "[out_features, in_features]");
  LOCKSTEP_CHECK(!b.defined() || b.shape() == Shape{out_features},
                 "Linear: the bias given has shape {}, not [{}]", runtime::shape_str(b.shape()),
                 out_features);
  weight = register_parameter("weight", w);
  if (b.defined()) bias = register_parameter("bias", b);
}

Tensor Linear::forward(const Tensor& x) {
  LOCKSTEP_CHECK(x.dim() >= 1 && x.size(-1) == in_features,
                 "Linear(in_features={}, out_features={}): input of shape {} must end in {}",
                 in_features, out_features, runtime::shape_str(x.shape()), in_features);
  return runtime::linear(x, weight, bias);
}

std::string Linear::extra_repr() const {
  return fmt::format("in_features={}, out_features={}, bias={}", in_features, out_features,
                     bias.defined());
}

namespace {

// As nn.Embedding: a padding_idx in [-num, num), negative from the end.
std::optional<int64_t> resolve_padding_idx(std::optional<int64_t> p, int64_t num) {
  if (!p) return p;
  LOCKSTEP_CHECK(*p >= -num && *p < num,
                 "Embedding: padding_idx {} is out of range for num_embeddings {}; give one in "
                 "[{}, {}) (negative counts from the end) or none",
                 *p, num, -num, num);
  return *p < 0 ? *p + num : *p;
}

}  // namespace

Embedding::Embedding(int64_t num, int64_t dim, Generator& gen)
    : Embedding(num, dim, EmbeddingOptions{}, gen) {}

Embedding::Embedding(int64_t num, int64_t dim, EmbeddingOptions opts, Generator& gen)
    : num_embeddings(num),
      embedding_dim(dim),
      padding_idx(resolve_padding_idx(opts.padding_idx, num)) {
  LOCKSTEP_CHECK(num >= 0 && dim >= 0,
                 "Embedding: num_embeddings ({}) and embedding_dim ({}) must be >= 0", num, dim);
  Tensor w = Tensor::empty({num, dim});
  runtime::normal_(w, 0.0, 1.0, gen);
  if (padding_idx) w.select(0, *padding_idx).zero_();
  weight = register_parameter("weight", w);
}

Tensor Embedding::forward(const Tensor& indices) {
  return runtime::embedding(indices, weight, padding_idx);
}

std::string Embedding::extra_repr() const {
  if (padding_idx) return fmt::format("{}, {}, padding_idx={}", num_embeddings, embedding_dim,
                                      *padding_idx);
  return fmt::format("{}, {}", num_embeddings, embedding_dim);
}

std::shared_ptr<Module> Linear::replicate() const {
  Generator unused;
  return std::make_shared<Linear>(in_features, out_features, bias.defined(), unused);
}
std::shared_ptr<Module> Embedding::replicate() const {
  Generator unused;
  return std::make_shared<Embedding>(num_embeddings, embedding_dim,
                                     EmbeddingOptions{.padding_idx = padding_idx}, unused);
}

}  // namespace lockstep::nn
