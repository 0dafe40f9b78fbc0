// BatchNorm1d, BatchNorm2d and LayerNorm, as PyTorch's.
#pragma once

#include <optional>
#include <vector>

#include "lockstep/nn/module.h"

namespace lockstep::nn {

struct BatchNormOptions {
  double eps = 1e-5;
  // nullopt: running statistics are the cumulative average over all batches
  // seen (factor 1/num_batches_tracked), as momentum=None in PyTorch.
  std::optional<double> momentum = 0.1;
  bool affine = true;               // learnable weight (init 1) and bias (init 0)
  bool track_running_stats = true;  // false: batch statistics in eval too
};

// What BatchNorm1d/2d share (PyTorch's _BatchNorm). Parameters: weight, bias
// (when affine). Buffers, in this order: running_mean (0), running_var (1),
// num_batches_tracked (i64 scalar), when track_running_stats.
class BatchNormBase : public Module {
 public:
  // Training: normalise with the batch statistics and update the running ones
  // in place (unbiased variance). Eval: normalise with the running ones. An
  // empty batch (N = 0, nn::Join) gives an empty output, leaves the running
  // statistics and num_batches_tracked as they are, and zero gradients.
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  std::vector<std::string> optional_state() const override { return {"num_batches_tracked"}; }
  void reset_running_stats();

  const int64_t num_features;
  const BatchNormOptions options;
  Tensor weight, bias;                                         // [C]
  Tensor running_mean, running_var, num_batches_tracked;

 protected:
  BatchNormBase(int64_t num_features, BatchNormOptions options);
  virtual void check_input_dim(const Tensor& input) const = 0;
};

// Input [N, C] or [N, C, L].
class BatchNorm1d : public BatchNormBase {
 public:
  explicit BatchNorm1d(int64_t num_features, BatchNormOptions options = {})
      : BatchNormBase(num_features, options) {}
  std::string type_name() const override { return "BatchNorm1d"; }
  std::shared_ptr<Module> replicate() const override;

 protected:
  void check_input_dim(const Tensor& input) const override;
};

// Input [N, C, H, W].
class BatchNorm2d : public BatchNormBase {
 public:
  explicit BatchNorm2d(int64_t num_features, BatchNormOptions options = {})
      : BatchNormBase(num_features, options) {}
  std::string type_name() const override { return "BatchNorm2d"; }
  std::shared_ptr<Module> replicate() const override;

 protected:
  void check_input_dim(const Tensor& input) const override;
};

// Normalises over the trailing `normalized_shape` dims; weight 1, bias 0.
// bias = false keeps the weight alone (PyTorch's LayerNorm(..., bias=False)).
class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::vector<int64_t> normalized_shape, double eps = 1e-5,
                     bool elementwise_affine = true, bool bias = true);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "LayerNorm"; }
  std::shared_ptr<Module> replicate() const override;
  std::string extra_repr() const override;

  const std::vector<int64_t> normalized_shape;
  const double eps;
  // normalized_shape; undefined without elementwise_affine (bias: or without bias)
  Tensor weight, bias;
};

}  // namespace lockstep::nn
