#include "lockstep/nn/normalization.h"

#include "lockstep/runtime/autograd/checkpoint.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops.h"

namespace lockstep::nn {

BatchNormBase::BatchNormBase(int64_t c, BatchNormOptions opts) : num_features(c), options(opts) {
  LOCKSTEP_CHECK(c > 0, "BatchNorm: num_features must be positive, got {}", c);
  if (opts.affine) {
    weight = register_parameter("weight", Tensor::ones({c}));
    bias = register_parameter("bias", Tensor::zeros({c}));
  }
  if (opts.track_running_stats) {
    running_mean = register_buffer("running_mean", Tensor::zeros({c}));
    running_var = register_buffer("running_var", Tensor::ones({c}));
    num_batches_tracked = register_buffer("num_batches_tracked", Tensor::scalar(0, DType::i64));
  }
}

void BatchNormBase::reset_running_stats() {
  if (!options.track_running_stats) return;
  runtime::NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1.0);
  num_batches_tracked.zero_();
}

Tensor BatchNormBase::forward(const Tensor& x) {
  check_input_dim(x);
  LOCKSTEP_CHECK(x.size(1) == num_features, "{}({}): input of shape {} has {} channels in dim 1",
                 type_name(), num_features, runtime::shape_str(x.shape()), x.size(1));
  // Mirrors torch.nn.modules.batchnorm._BatchNorm.forward, except that the
  // batch is counted once batch_norm has accepted it: a forward refused there
  // (a batch of one value per channel, a dtype mismatch) leaves
  // num_batches_tracked as it leaves the running statistics, so that a
  // caller who skips it keeps the cumulative average (momentum unset) exact.
  // An empty batch (a joined rank's, nn::Join) is not counted either, nor is
  // a checkpoint's recomputation of this forward: the batch was counted once.
  const bool recomputing = runtime::in_checkpoint_recomputation();
  const bool count_batch =
      is_training() && options.track_running_stats && x.numel() > 0 && !recomputing;
  double factor = options.momentum.value_or(0.0);
  if (count_batch && !options.momentum) factor = 1.0 / (num_batches_tracked.item() + 1.0);
  // Batch statistics in training, and always when there are no running ones.
  const bool use_batch_stats = is_training() || !running_mean.defined();
  // Running statistics are updated only in training with tracking on (outside
  // a recomputation), and read only in eval.
  const bool pass_running = !is_training() || (options.track_running_stats && !recomputing);
  Tensor out = runtime::batch_norm(x, weight, bias, pass_running ? running_mean : Tensor{},
                                   pass_running ? running_var : Tensor{}, use_batch_stats,
                                   factor, options.eps);
  if (count_batch) {
    runtime::NoGradGuard no_grad;
    num_batches_tracked.add_(Tensor::full({}, 1.0, DType::i64, num_batches_tracked.device()));
  }
  return out;
}

std::string BatchNormBase::extra_repr() const {
  return fmt::format("{}, eps={}, momentum={}, affine={}, track_running_stats={}", num_features,
                     options.eps,
                     options.momentum ? fmt::format("{}", *options.momentum) : std::string("None"),
                     options.affine, options.track_running_stats);
}

void BatchNorm1d::check_input_dim(const Tensor& x) const {
  LOCKSTEP_CHECK(x.dim() == 2 || x.dim() == 3, "BatchNorm1d: expected 2D or 3D input (got {}D input)",
                 x.dim());
}

void BatchNorm2d::check_input_dim(const Tensor& x) const {
  LOCKSTEP_CHECK(x.dim() == 4, "BatchNorm2d: expected 4D input (got {}D input)", x.dim());
}

LayerNorm::LayerNorm(std::vector<int64_t> shape, double eps_, bool affine, bool with_bias)
    : normalized_shape(std::move(shape)), eps(eps_) {
  LOCKSTEP_CHECK(!normalized_shape.empty(), "LayerNorm: normalized_shape must not be empty");
  if (affine) {
    weight = register_parameter("weight", Tensor::ones(normalized_shape));
    if (with_bias) bias = register_parameter("bias", Tensor::zeros(normalized_shape));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  return runtime::layer_norm(x, normalized_shape, weight, bias, eps);
}

std::string LayerNorm::extra_repr() const {
  // normalized_shape as the Python tuple PyTorch prints: (4,) or (4, 5).
  std::string shape = "(";
  for (size_t i = 0; i < normalized_shape.size(); ++i)
    shape += (i ? ", " : "") + std::to_string(normalized_shape[i]);
  shape += normalized_shape.size() == 1 ? ",)" : ")";
  return fmt::format("{}, eps={}, elementwise_affine={}{}", shape, eps, weight.defined(),
                     weight.defined() && !bias.defined() ? ", bias=False" : "");
}

std::shared_ptr<Module> BatchNorm1d::replicate() const {
  return std::make_shared<BatchNorm1d>(num_features, options);
}
std::shared_ptr<Module> BatchNorm2d::replicate() const {
  return std::make_shared<BatchNorm2d>(num_features, options);
}
std::shared_ptr<Module> LayerNorm::replicate() const {
  return std::make_shared<LayerNorm>(normalized_shape, eps, weight.defined(), bias.defined());
}

}  // namespace lockstep::nn
