#include "optimizer_setup.h"

#include <algorithm>

#include "lockstep/optim/adam.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/optim/zero_redundancy_optimizer.h"
#include "lockstep/runtime/error.h"

namespace fashion_mnist {

using namespace lockstep;

double learning_rate(const Options& o) {
  if (o.lr > 0) return o.lr;
  return o.optimizer == "sgd" ? 0.05 : 1e-3;
}

double weight_decay(const Options& o) {
  return o.weight_decay.value_or(o.optimizer == "adamw" ? optim::AdamWOptions{}.weight_decay : 0.0);
}

std::unique_ptr<optim::Optimizer> make_optimizer(const Options& o,
                                                 std::vector<runtime::Tensor> params,
                                                 std::shared_ptr<collectives::ProcessGroup> group) {
  const double lr = learning_rate(o), decay = weight_decay(o);
  optim::OptimizerFactory factory = [&o, lr, decay](std::vector<optim::ParamGroup> groups)
      -> std::unique_ptr<optim::Optimizer> {
    if (o.optimizer == "sgd")
      return std::make_unique<optim::SGD>(
          std::move(groups),
          optim::SGDOptions{.lr = lr, .momentum = o.momentum, .weight_decay = decay});
    if (o.optimizer == "adam")
      return std::make_unique<optim::Adam>(
          std::move(groups), optim::AdamOptions{.lr = lr, .weight_decay = decay});
    optim::AdamWOptions w;
    w.lr = lr;
    w.weight_decay = decay;  // 0 included: AdamW without decay
    return std::make_unique<optim::AdamW>(std::move(groups), w);
  };
  if (o.zero)
    return std::make_unique<optim::ZeroRedundancyOptimizer>(std::move(params), std::move(group),
                                                            factory);
  return factory({{std::move(params), {}}});
}

std::unique_ptr<optim::LRScheduler> make_scheduler(const Options& o, optim::Optimizer& opt,
                                                   int64_t steps_per_epoch, int64_t total_steps) {
  const std::string& s = o.lr_schedule;
  if (s == "none") return nullptr;
  if (s == "step") return std::make_unique<optim::StepLR>(opt, optim::StepLROptions{steps_per_epoch, 0.5});
  if (s == "multistep")
    return std::make_unique<optim::MultiStepLR>(
        opt, optim::MultiStepLROptions{{total_steps / 2, total_steps * 3 / 4}, 0.1});
  if (s == "cosine") return std::make_unique<optim::CosineLR>(opt, optim::CosineLROptions{total_steps});
  if (s == "warmup")
    return std::make_unique<optim::LinearLR>(
        opt, optim::LinearLROptions{.start_factor = 0.01, .total_steps = std::max<int64_t>(1, o.warmup_steps)});
  const int64_t warmup = std::min(o.warmup_steps, total_steps - 1);
  if (s == "warmup-cosine")
    return std::make_unique<optim::WarmupCosineLR>(
        opt, optim::WarmupCosineLROptions{
                 .warmup_steps = warmup, .total_steps = total_steps, .start_factor = 0.01});
  if (s == "onecycle")
    return std::make_unique<optim::OneCycleLR>(
        opt, optim::OneCycleLROptions{.max_lr = learning_rate(o), .total_steps = total_steps});
  throw Error("unknown --lr-schedule " + s);
}

}  // namespace fashion_mnist
