// Learning-rate schedules, shaped like torch.optim.lr_scheduler. A scheduler
// owns no learning rate of its own: each step() writes the schedule's value
// into the "lr" option of every parameter group of its optimizer.
//
//   optim::Adam opt(params, {.lr = 1e-3});
//   optim::WarmupCosineLR sched(opt, {.warmup_steps = 100, .total_steps = 5000});
//   for (...) { ...; opt.step(); sched.step(); }
//
// As in PyTorch, construction applies the value for step 0, and step()
// advances by one. Values come from each schedule's closed form, so a
// scheduler restored from state_dict() continues exactly where it left off.
// Edits to a group's "lr" between steps are overwritten by the next step().
//
// One scheduler per optimizer at a time: making a second one while the first
// exists throws. PyTorch lets several schedulers step one optimizer and
// chains them (each multiplies the current rate by its own factor); here each
// would write its own closed form and the last one stepped would silently
// win, so that is refused rather than done differently. To combine
// schedules:
//   - warmup then cosine decay: WarmupCosineLR (PyTorch's SequentialLR of
//     LinearLR and CosineAnnealingLR);
//   - one schedule after another: destroy the first scheduler, then make the
//     next, whose base rates are the rates the first left (SequentialLR-like).
// A scheduler may outlive its optimizer only to be destroyed: anything else
// it is asked then throws (a new optimizer, as when unfreezing part of a
// model, needs a new scheduler).
#pragma once

#include <memory>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lockstep/optim/optimizer.h"

namespace lockstep::optim {

// {"last_epoch": ..., "base_lr.0": ..., "option.gamma": ...}: numbers only,
// so a checkpoint can keep it in its metadata. The "option." entries are the
// schedule's settings: a resumed run must be built with the same ones.
using SchedulerState = std::map<std::string, double>;

class LRScheduler {
 public:
  virtual ~LRScheduler();  // the optimizer may take another scheduler then
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Advances by one and writes the new rates. When the schedule has no value
  // there (one-cycle past total_steps) it throws and changes nothing.
  void step();
  int64_t last_epoch() const { return last_epoch_; }
  // The learning rate step() last wrote, per group (PyTorch's get_last_lr()).
  const std::vector<double>& last_lr() const { return last_lr_; }
  // Each group's learning rate when the scheduler was made (its "initial_lr").
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  const std::string& name() const { return name_; }
  // Whether this scheduler sets `optimizer`'s rates (the one it was made
  // for, while that lives).
  bool drives(const Optimizer& optimizer) const;

  SchedulerState state_dict() const;
  // Throws, naming what differs, unless `state` fits this scheduler: a valid
  // position at which the schedule has a value, one base rate (>= 0) per
  // group, and the same settings (a state without "option." entries, from an
  // older file, skips that check).
  void check_state_dict(const SchedulerState& state) const;
  // Restores the position and the base rates and writes the current rates
  // into the optimizer; checks first, and changes nothing when it throws.
  void load_state_dict(const SchedulerState& state);
  // The schedule's settings, by name ("gamma", "milestone.0", ...).
  virtual SchedulerState options() const = 0;
  // Whether each group's rate follows its base rate (the schedule's factor
  // times it), so that other base rates give other rates: all but one-cycle,
  // whose rates come from its max_lr alone.
  virtual bool follows_base_lrs() const { return true; }

 protected:
  // Subclasses call start() at the end of their constructor (after checking
  // their options), which applies step 0. Throws if `optimizer` already has a
  // scheduler.
  LRScheduler(std::string name, Optimizer& optimizer);
  void start();
  // The schedule's closed form at `epoch` for a group that started at `base_lr`.
  virtual double lr_at(int64_t epoch, double base_lr) const = 0;
  // For schedules that also set other options (one-cycle's momentum).
  virtual void apply_extra(int64_t /*epoch*/, GroupOptions& /*options*/) const {}

  const std::string name_;
  Optimizer& optimizer_;

 private:
  // Every group's options at `epoch` for base rates `base`, worked out
  // without changing anything (throws where the schedule has no value).
  std::vector<GroupOptions> options_at(int64_t epoch, const std::vector<double>& base) const;
  // Computes, then writes the options and takes the position and bases.
  void apply(int64_t epoch, std::vector<double> base);

  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
  int64_t last_epoch_ = -1;
  // The optimizer's scheduler slot (optimizer.h), holding name_ while this
  // scheduler lives.
  std::shared_ptr<std::string> slot_;
  // Expires with the optimizer: every use of optimizer_ checks it first.
  std::weak_ptr<const bool> optimizer_lifetime_;
};

// lr = base * gamma^floor(epoch / step_size)           (StepLR)
struct StepLROptions {
  int64_t step_size = 1;
  double gamma = 0.1;  // >= 0
};
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, StepLROptions options);
  SchedulerState options() const override;

 protected:
  double lr_at(int64_t epoch, double base_lr) const override;
  StepLROptions o_;
};

// lr = base * gamma^(milestones <= epoch)              (MultiStepLR)
struct MultiStepLROptions {
  std::vector<int64_t> milestones;  // increasing
  double gamma = 0.1;               // >= 0
};
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, MultiStepLROptions options);
  SchedulerState options() const override;

 protected:
  double lr_at(int64_t epoch, double base_lr) const override;
  MultiStepLROptions o_;
};

// lr = eta_min + (base - eta_min) * (1 + cos(pi * epoch / t_max)) / 2   (CosineAnnealingLR)
struct CosineLROptions {
  int64_t t_max = 1;
  double eta_min = 0.0;  // >= 0
};
class CosineLR : public LRScheduler {
 public:
  CosineLR(Optimizer& optimizer, CosineLROptions options);
  SchedulerState options() const override;

 protected:
  double lr_at(int64_t epoch, double base_lr) const override;
  CosineLROptions o_;
};

// Linear warmup: the factor goes from start_factor to end_factor over
// total_steps, then stays (LinearLR).
struct LinearLROptions {
  double start_factor = 1.0 / 3.0;
  double end_factor = 1.0;
  int64_t total_steps = 5;
};
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, LinearLROptions options);
  SchedulerState options() const override;

 protected:
  double lr_at(int64_t epoch, double base_lr) const override;
  LinearLROptions o_;
};

// Linear warmup from start_factor * base to base over warmup_steps, then
// cosine from base down to eta_min at total_steps. PyTorch's equivalent:
// SequentialLR([LinearLR(start_factor, 1, warmup), CosineAnnealingLR(total -
// warmup, eta_min)], milestones=[warmup]).
struct WarmupCosineLROptions {
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double start_factor = 1e-3;
  double eta_min = 0.0;  // >= 0
};
class WarmupCosineLR : public LRScheduler {
 public:
  WarmupCosineLR(Optimizer& optimizer, WarmupCosineLROptions options);
  SchedulerState options() const override;

 protected:
  double lr_at(int64_t epoch, double base_lr) const override;
  WarmupCosineLROptions o_;
};

// The one-cycle policy (OneCycleLR, two phases): lr rises from max_lr /
// div_factor to max_lr over pct_start of total_steps, then anneals to
// initial / final_div_factor; momentum ("momentum" for SGD, "beta1" for
// Adam) moves the opposite way between max_momentum and base_momentum.
// Stepping past total_steps is an error, as in PyTorch. At total_steps
// itself (after the last step) the final values hold, where PyTorch
// extrapolates the last phase (to a negative rate when linear).
struct OneCycleLROptions {
  double max_lr = 0.1;
  int64_t total_steps = 1;
  double pct_start = 0.3;
  bool cosine = true;  // false: linear annealing
  bool cycle_momentum = true;
  double base_momentum = 0.85;
  double max_momentum = 0.95;
  double div_factor = 25.0;
  double final_div_factor = 1e4;
};
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, OneCycleLROptions options);
  SchedulerState options() const override;
  bool follows_base_lrs() const override { return false; }

 protected:
  double lr_at(int64_t epoch, double base_lr) const override;
  void apply_extra(int64_t epoch, GroupOptions& options) const override;
  // Where `epoch` lies: the phase's start and end values and the fraction done.
  double anneal(int64_t epoch, double start_value, double peak_value, double end_value) const;
  OneCycleLROptions o_;
  std::string momentum_key_;  // "momentum", "beta1", or empty
};

}  // namespace lockstep::optim
