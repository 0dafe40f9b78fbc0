#include "lockstep/nn/loss.h"

#include "lockstep/runtime/error.h"

namespace lockstep::nn {

namespace {

[[noreturn]] void needs_target(const std::string& loss) {
  throw Error(loss + " takes (input, target); call it with both, e.g. loss(logits, labels)");
}

// The (input, target) of a loss called through forward_values.
std::pair<Tensor, Tensor> input_and_target(const std::string& loss, const Values& inputs) {
  LOCKSTEP_CHECK(inputs.size() == 2 && inputs.is_tensor(0) && inputs.is_tensor(1),
                 "{} takes two tensors, (input, target), but was called with {} values{}", loss,
                 inputs.size(),
                 inputs.size() == 0 ? ""
                 : inputs.size() == 1
                     ? " (" + describe(inputs[0]) + ")"
                     : " (" + describe(inputs[0]) + ", " + describe(inputs[1]) +
                           (inputs.size() > 2 ? ", ..." : "") + ")");
  return {inputs.tensor(0), inputs.tensor(1)};
}

}  // namespace

CrossEntropyLoss::CrossEntropyLoss(CrossEntropyLossOptions opts) : options(opts) {
  LOCKSTEP_CHECK(opts.label_smoothing >= 0.0 && opts.label_smoothing <= 1.0,
                 "CrossEntropyLoss: label_smoothing must be in [0, 1], got {}",
                 opts.label_smoothing);
  if (opts.weight) weight = register_buffer("weight", *opts.weight);
}

Tensor CrossEntropyLoss::forward(const Tensor&) { needs_target(type_name()); }

Tensor CrossEntropyLoss::forward(const Tensor& logits, const Tensor& target) {
  if (weight.defined())
    return runtime::cross_entropy(logits, target, weight, options.label_smoothing,
                                  options.reduction, options.ignore_index);
  return runtime::cross_entropy(logits, target, options.label_smoothing, options.reduction,
                                options.ignore_index);
}

Values CrossEntropyLoss::forward_values(const Values& inputs) {
  const auto [logits, target] = input_and_target(type_name(), inputs);
  return {forward(logits, target)};
}

std::string CrossEntropyLoss::extra_repr() const {
  std::string out;
  if (options.ignore_index) out = fmt::format("ignore_index={}", *options.ignore_index);
  if (options.label_smoothing != 0.0)
    out += fmt::format("{}label_smoothing={}", out.empty() ? "" : ", ", options.label_smoothing);
  return out;
}

Tensor MSELoss::forward(const Tensor&) { needs_target(type_name()); }

Tensor MSELoss::forward(const Tensor& input, const Tensor& target) {
  return runtime::mse_loss(input, target, reduction);
}

Values MSELoss::forward_values(const Values& inputs) {
  const auto [input, target] = input_and_target(type_name(), inputs);
  return {forward(input, target)};
}

std::shared_ptr<Module> CrossEntropyLoss::replicate() const {
  CrossEntropyLossOptions copy = options;
  if (weight.defined()) copy.weight = weight.clone();  // DataParallel copies the values in
  return std::make_shared<CrossEntropyLoss>(copy);
}
std::shared_ptr<Module> MSELoss::replicate() const { return std::make_shared<MSELoss>(reduction); }

Tensor PairLoss::forward(const Tensor&) { needs_target(type_name()); }

Values PairLoss::forward_values(const Values& inputs) {
  const auto [input, target] = input_and_target(type_name(), inputs);
  return {loss(input, target)};
}

namespace {

// A copy of an optional weight for a replica (DataParallel then copies the
// buffers' values in); an undefined one stays undefined.
std::optional<Tensor> copy_of(const Tensor& t) {
  if (!t.defined()) return std::nullopt;
  return t.clone();
}

// The buffer itself, or none, for a call.
std::optional<Tensor> buffer_or_none(const Tensor& t) {
  if (!t.defined()) return std::nullopt;
  return t;
}

}  // namespace

BCELoss::BCELoss(runtime::BceOptions options) : reduction(options.reduction) {
  if (options.weight) weight = register_buffer("weight", *options.weight);
}

Tensor BCELoss::loss(const Tensor& input, const Tensor& target) {
  return runtime::binary_cross_entropy(
      input, target, {.weight = buffer_or_none(weight), .reduction = reduction});
}

std::shared_ptr<Module> BCELoss::replicate() const {
  return std::make_shared<BCELoss>(
      runtime::BceOptions{.weight = copy_of(weight), .reduction = reduction});
}

BCEWithLogitsLoss::BCEWithLogitsLoss(runtime::BceWithLogitsOptions options)
    : reduction(options.reduction) {
  if (options.weight) weight = register_buffer("weight", *options.weight);
  if (options.pos_weight) pos_weight = register_buffer("pos_weight", *options.pos_weight);
}

Tensor BCEWithLogitsLoss::loss(const Tensor& input, const Tensor& target) {
  return runtime::binary_cross_entropy_with_logits(input, target,
                                                   {.weight = buffer_or_none(weight),
                                                    .pos_weight = buffer_or_none(pos_weight),
                                                    .reduction = reduction});
}

std::shared_ptr<Module> BCEWithLogitsLoss::replicate() const {
  return std::make_shared<BCEWithLogitsLoss>(runtime::BceWithLogitsOptions{
      .weight = copy_of(weight), .pos_weight = copy_of(pos_weight), .reduction = reduction});
}

Tensor L1Loss::loss(const Tensor& input, const Tensor& target) {
  return runtime::l1_loss(input, target, reduction);
}
std::shared_ptr<Module> L1Loss::replicate() const { return std::make_shared<L1Loss>(reduction); }

SmoothL1Loss::SmoothL1Loss(Reduction reduction, double beta) : reduction(reduction), beta(beta) {
  LOCKSTEP_CHECK(beta >= 0, "SmoothL1Loss: beta must be >= 0 (0 is L1Loss), got {}", beta);
}
Tensor SmoothL1Loss::loss(const Tensor& input, const Tensor& target) {
  return runtime::smooth_l1_loss(input, target, reduction, beta);
}
std::shared_ptr<Module> SmoothL1Loss::replicate() const {
  return std::make_shared<SmoothL1Loss>(reduction, beta);
}

HuberLoss::HuberLoss(Reduction reduction, double delta) : reduction(reduction), delta(delta) {
  LOCKSTEP_CHECK(delta > 0, "HuberLoss: delta must be > 0, got {}", delta);
}
Tensor HuberLoss::loss(const Tensor& input, const Tensor& target) {
  return runtime::huber_loss(input, target, reduction, delta);
}
std::shared_ptr<Module> HuberLoss::replicate() const {
  return std::make_shared<HuberLoss>(reduction, delta);
}

NLLLoss::NLLLoss(runtime::NllOptions options)
    : ignore_index(options.ignore_index), reduction(options.reduction) {
  if (options.weight) weight = register_buffer("weight", *options.weight);
}

Tensor NLLLoss::loss(const Tensor& input, const Tensor& target) {
  return runtime::nll_loss(input, target,
                           {.weight = buffer_or_none(weight),
                            .ignore_index = ignore_index,
                            .reduction = reduction});
}

std::shared_ptr<Module> NLLLoss::replicate() const {
  return std::make_shared<NLLLoss>(runtime::NllOptions{
      .weight = copy_of(weight), .ignore_index = ignore_index, .reduction = reduction});
}

std::string NLLLoss::extra_repr() const {
  return ignore_index ? fmt::format("ignore_index={}", *ignore_index) : "";
}

Tensor KLDivLoss::loss(const Tensor& input, const Tensor& target) {
  return runtime::kl_div(input, target, reduction, log_target);
}
std::shared_ptr<Module> KLDivLoss::replicate() const {
  return std::make_shared<KLDivLoss>(reduction, log_target);
}

}  // namespace lockstep::nn
