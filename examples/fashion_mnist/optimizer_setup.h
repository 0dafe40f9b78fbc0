// The optimizer and LR schedule that --optimizer, --lr-schedule and --zero ask for.
#pragma once

#include <memory>

#include "lockstep/collectives/process_group.h"
#include "lockstep/optim/lr_scheduler.h"
#include "lockstep/optim/optimizer.h"
#include "options.h"

namespace fashion_mnist {

// The learning rate in use: --lr, or the optimizer's usual one.
double learning_rate(const Options& o);
// The weight decay in use: --weight-decay (0 included), or the optimizer's
// default (AdamW's 1e-2, else 0).
double weight_decay(const Options& o);

// SGD (with --momentum), Adam or AdamW over `params`; wrapped in a
// ZeroRedundancyOptimizer over `group` with --zero.
std::unique_ptr<lockstep::optim::Optimizer> make_optimizer(
    const Options& o, std::vector<lockstep::runtime::Tensor> params,
    std::shared_ptr<lockstep::collectives::ProcessGroup> group);

// The schedule over `total_steps` optimizer steps, stepped once per step;
// null for --lr-schedule none.
std::unique_ptr<lockstep::optim::LRScheduler> make_scheduler(const Options& o,
                                                             lockstep::optim::Optimizer& opt,
                                                             int64_t steps_per_epoch,
                                                             int64_t total_steps);

}  // namespace fashion_mnist
