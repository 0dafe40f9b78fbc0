#include "lockstep/nn/loss.h"

#include "lockstep/runtime/error.h"

namespace lockstep::nn {

namespace {

[[noreturn]] void needs_target(const std::string& loss) {
  throw Error(loss + " takes (input, target); call it with both, e.g. loss(logits, labels)");
}

}  // namespace

CrossEntropyLoss::CrossEntropyLoss(CrossEntropyLossOptions opts) : options(opts) {
  LOCKSTEP_CHECK(opts.label_smoothing >= 0.0 && opts.label_smoothing <= 1.0,
                 "CrossEntropyLoss: label_smoothing must be in [0, 1], got {}",
                 opts.label_smoothing);
}

Tensor CrossEntropyLoss::forward(const Tensor&) { needs_target(type_name()); }

Tensor CrossEntropyLoss::forward(const Tensor& logits, const Tensor& target) {
  return runtime::cross_entropy(logits, target, options.label_smoothing, options.reduction,
                                options.ignore_index);
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

std::shared_ptr<Module> CrossEntropyLoss::replicate() const {
  return std::make_shared<CrossEntropyLoss>(options);
}
std::shared_ptr<Module> MSELoss::replicate() const { return std::make_shared<MSELoss>(reduction); }

}  // namespace lockstep::nn
