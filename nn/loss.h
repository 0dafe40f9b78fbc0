// Losses as modules, over runtime::cross_entropy, runtime::mse_loss,
// runtime::nll_loss and the losses of runtime/ops/pointwise_loss.h (the same functions are in
// nn::functional). Called with (input, target), or
// through forward_values({input, target}) (DataParallel, Sequential, DDP),
// which returns the loss alone.
#pragma once

#include "lockstep/nn/module.h"
#include "lockstep/runtime/ops/loss.h"
#include "lockstep/runtime/ops/nll_loss.h"
#include "lockstep/runtime/ops/pointwise_loss.h"

namespace lockstep::nn {

using runtime::Reduction;

struct CrossEntropyLossOptions {
  double label_smoothing = 0.0;  // target = (1-s)*onehot + s/C
  Reduction reduction = Reduction::Mean;
  // Samples with this target add nothing (runtime::cross_entropy); PyTorch's
  // default is -100, lockstep's none.
  std::optional<int64_t> ignore_index;
  // One weight per class, [C] (runtime::cross_entropy with a weight, in
  // ops/nll_loss.h); kept as a buffer named "weight", as PyTorch's.
  std::optional<Tensor> weight;
};

// logits [N, C], target [N] of class indices (i64 or i32). N = 0 (an empty
// batch, nn::Join): the Mean loss is 0, not PyTorch's NaN, and the gradient
// is empty.
class CrossEntropyLoss : public Module {
 public:
  explicit CrossEntropyLoss(CrossEntropyLossOptions options = {});
  Tensor forward(const Tensor& logits, const Tensor& target);
  Tensor operator()(const Tensor& logits, const Tensor& target) { return forward(logits, target); }
  Tensor forward(const Tensor& input) override;  // an error: a loss needs a target
  Values forward_values(const Values& inputs) override;  // {logits, target} -> {loss}
  std::string type_name() const override { return "CrossEntropyLoss"; }
  std::shared_ptr<Module> replicate() const override;
  std::string extra_repr() const override;

  const CrossEntropyLossOptions options;  // options.weight: as given, before any to()
  Tensor weight;                          // the buffer; undefined without a weight
};

class MSELoss : public Module {
 public:
  explicit MSELoss(Reduction reduction = Reduction::Mean) : reduction(reduction) {}
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  Tensor forward(const Tensor& input) override;  // an error
  Values forward_values(const Values& inputs) override;  // {input, target} -> {loss}
  std::string type_name() const override { return "MSELoss"; }
  std::shared_ptr<Module> replicate() const override;

  const Reduction reduction;
};

// The base of the losses below: called as loss(input, target) or through
// forward_values({input, target}), which returns the loss alone; forward
// with one tensor is an error.
class PairLoss : public Module {
 public:
  Tensor forward(const Tensor& input, const Tensor& target) { return loss(input, target); }
  Tensor operator()(const Tensor& input, const Tensor& target) { return loss(input, target); }
  Tensor forward(const Tensor& input) override;
  Values forward_values(const Values& inputs) override;

 protected:
  virtual Tensor loss(const Tensor& input, const Tensor& target) = 0;
};

// torch.nn.BCELoss: input probabilities in [0, 1] (runtime::binary_cross_entropy).
// A weight is a buffer named "weight" (moved by to(), in state_dict), as PyTorch's.
class BCELoss : public PairLoss {
 public:
  explicit BCELoss(runtime::BceOptions options = {});
  std::string type_name() const override { return "BCELoss"; }
  std::shared_ptr<Module> replicate() const override;

  Tensor weight;  // undefined when none was given
  const Reduction reduction;

 protected:
  Tensor loss(const Tensor& input, const Tensor& target) override;
};

// torch.nn.BCEWithLogitsLoss: input logits (runtime::binary_cross_entropy_with_logits).
// weight and pos_weight, when given, are buffers of those names.
class BCEWithLogitsLoss : public PairLoss {
 public:
  explicit BCEWithLogitsLoss(runtime::BceWithLogitsOptions options = {});
  std::string type_name() const override { return "BCEWithLogitsLoss"; }
  std::shared_ptr<Module> replicate() const override;

  Tensor weight, pos_weight;  // undefined when not given
  const Reduction reduction;

 protected:
  Tensor loss(const Tensor& input, const Tensor& target) override;
};

class L1Loss : public PairLoss {
 public:
  explicit L1Loss(Reduction reduction = Reduction::Mean) : reduction(reduction) {}
  std::string type_name() const override { return "L1Loss"; }
  std::shared_ptr<Module> replicate() const override;

  const Reduction reduction;

 protected:
  Tensor loss(const Tensor& input, const Tensor& target) override;
};

// beta >= 0 (0 is L1Loss), checked here.
class SmoothL1Loss : public PairLoss {
 public:
  explicit SmoothL1Loss(Reduction reduction = Reduction::Mean, double beta = 1.0);
  std::string type_name() const override { return "SmoothL1Loss"; }
  std::shared_ptr<Module> replicate() const override;

  const Reduction reduction;
  const double beta;

 protected:
  Tensor loss(const Tensor& input, const Tensor& target) override;
};

// delta > 0, checked here.
class HuberLoss : public PairLoss {
 public:
  explicit HuberLoss(Reduction reduction = Reduction::Mean, double delta = 1.0);
  std::string type_name() const override { return "HuberLoss"; }
  std::shared_ptr<Module> replicate() const override;

  const Reduction reduction;
  const double delta;

 protected:
  Tensor loss(const Tensor& input, const Tensor& target) override;
};

// torch.nn.NLLLoss over log-probabilities [N, C] or [N, C, d1, ...]
// (runtime::nll_loss). A
// class weight is a buffer named "weight", as PyTorch's.
class NLLLoss : public PairLoss {
 public:
  explicit NLLLoss(runtime::NllOptions options = {});
  std::string type_name() const override { return "NLLLoss"; }
  std::shared_ptr<Module> replicate() const override;
  std::string extra_repr() const override;

  Tensor weight;  // undefined when none was given
  const std::optional<int64_t> ignore_index;
  const Reduction reduction;

 protected:
  Tensor loss(const Tensor& input, const Tensor& target) override;
};

// torch.nn.KLDivLoss (runtime::kl_div): input log-probabilities. PyTorch's
// default reduction is 'mean'; BatchMean is the KL divergence per sample.
class KLDivLoss : public PairLoss {
 public:
  explicit KLDivLoss(runtime::KlDivReduction reduction = runtime::KlDivReduction::Mean,
                     bool log_target = false)
      : reduction(reduction), log_target(log_target) {}
  std::string type_name() const override { return "KLDivLoss"; }
  std::shared_ptr<Module> replicate() const override;

  const runtime::KlDivReduction reduction;
  const bool log_target;

 protected:
  Tensor loss(const Tensor& input, const Tensor& target) override;
};

}  // namespace lockstep::nn
