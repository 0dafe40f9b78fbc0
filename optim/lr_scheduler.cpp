#include "lockstep/optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include "lockstep/runtime/error.h"

namespace lockstep::optim {

namespace {

double cosine_between(double from, double to, double fraction) {
  return to + (from - to) / 2.0 * (std::cos(std::numbers::pi * fraction) + 1.0);
}

std::string base_lr_key(size_t group) { return fmt::format("base_lr.{}", group); }

// A factor or floor of a schedule's rates: one below 0 (or NaN) makes a rate
// negative some steps in, where the optimizer's step would refuse it.
void check_not_negative(const char* scheduler, const char* what, double value) {
  LOCKSTEP_CHECK(value >= 0.0,
                 "{}: {} {} must be >= 0; it would make the learning rate negative (or NaN) "
                 "later in the schedule",
                 scheduler, what, value);
}

const std::string kOptionPrefix = "option.";

// A state's "base_lr.0", "base_lr.1", ...
std::vector<double> saved_base_lrs(const SchedulerState& state) {
  std::vector<double> base;
  while (state.contains(base_lr_key(base.size()))) base.push_back(state.at(base_lr_key(base.size())));
  return base;
}

}  // namespace

// ---- LRScheduler --------------------------------------------------------------

LRScheduler::LRScheduler(std::string name, Optimizer& optimizer)
    : name_(std::move(name)),
      optimizer_(optimizer),
      slot_(optimizer.scheduler_),
      optimizer_lifetime_(optimizer.lifetime_) {
  LOCKSTEP_CHECK(slot_->empty(),
                 "{}: this {} already has an LR scheduler, {}; an optimizer takes one at a time. "
                 "Each sets \"lr\" to its own schedule's value, so two would overwrite each "
                 "other rather than chain as PyTorch's do. For warmup then cosine decay use "
                 "WarmupCosineLR; to run one schedule after another, destroy the first scheduler "
                 "before making the next (it starts from the rates the first left)",
                 name_, optimizer.name(), *slot_);
  for (const auto& group : optimizer_.param_groups()) {
    auto it = group.options.find("lr");
    LOCKSTEP_CHECK(it != group.options.end(), "{}: the optimizer's parameter groups have no \"lr\"",
                   name_);
    base_lrs_.push_back(it->second);
  }
  *slot_ = name_;  // last: the destructor, which frees it, runs only from here on
}

LRScheduler::~LRScheduler() { slot_->clear(); }

bool LRScheduler::drives(const Optimizer& optimizer) const {
  return !optimizer_lifetime_.expired() && &optimizer_ == &optimizer;
}

void LRScheduler::start() { step(); }

void LRScheduler::step() { apply(last_epoch_ + 1, base_lrs_); }

std::vector<GroupOptions> LRScheduler::options_at(int64_t epoch,
                                                  const std::vector<double>& base) const {
  // A program that makes a new optimizer (to unfreeze a backbone) and steps
  // the old one's scheduler would write through a dangling reference.
  LOCKSTEP_CHECK(!optimizer_lifetime_.expired(),
                 "{}: the optimizer this scheduler was made for has been destroyed; a scheduler "
                 "drives only its own optimizer. After making a new optimizer (as when "
                 "unfreezing part of a model), destroy this scheduler and make one for the new "
                 "optimizer",
                 name_);
  const auto& groups = optimizer_.param_groups();
  // A group added after the scheduler (add_param_group when unfreezing part
  // of a model) has no base rate. A scheduler made again now would take the
  // current, already scheduled rates as its bases and start over from step 0.
  LOCKSTEP_CHECK(groups.size() == base.size(),
                 "{}: the optimizer has {} parameter group(s) but the scheduler was made for {}; "
                 "a group added after the scheduler has no place in its schedule. Add every "
                 "group before making the scheduler: to unfreeze parameters later, give them a "
                 "group of their own from the start (the optimizer skips parameters without a "
                 "gradient). A scheduler made now would start the schedule over from the "
                 "current rates",
                 name_, groups.size(), base.size());
  std::vector<GroupOptions> out;
  out.reserve(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    GroupOptions options = groups[g].options;
    options["lr"] = lr_at(epoch, base[g]);
    apply_extra(epoch, options);
    out.push_back(std::move(options));
  }
  return out;
}

void LRScheduler::apply(int64_t epoch, std::vector<double> base) {
  std::vector<GroupOptions> options = options_at(epoch, base);  // may throw: nothing changed yet
  auto& groups = optimizer_.param_groups();
  std::vector<double> lrs;
  lrs.reserve(options.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    lrs.push_back(options[g].at("lr"));
    groups[g].options = std::move(options[g]);
  }
  last_lr_ = std::move(lrs);
  base_lrs_ = std::move(base);
  last_epoch_ = epoch;
}

SchedulerState LRScheduler::state_dict() const {
  SchedulerState s{{"last_epoch", static_cast<double>(last_epoch_)}};
  for (size_t g = 0; g < base_lrs_.size(); ++g) s[base_lr_key(g)] = base_lrs_[g];
  for (const auto& [key, value] : options()) s[kOptionPrefix + key] = value;
  return s;
}

void LRScheduler::check_state_dict(const SchedulerState& state) const {
  auto epoch = state.find("last_epoch");
  LOCKSTEP_CHECK(epoch != state.end() && epoch->second >= -1 && epoch->second < 0x1p62 &&
                     epoch->second == std::floor(epoch->second),
                 "{}.load_state_dict: the state has no valid \"last_epoch\"; it is not a "
                 "scheduler state",
                 name_);
  size_t groups = 0;
  while (state.contains(base_lr_key(groups))) ++groups;
  LOCKSTEP_CHECK(groups == base_lrs_.size(),
                 "{}.load_state_dict: the state is for {} parameter group(s), this scheduler's "
                 "optimizer has {}",
                 name_, groups, base_lrs_.size());
  for (size_t g = 0; g < groups; ++g) {
    const double base = state.at(base_lr_key(g));
    LOCKSTEP_CHECK(base >= 0.0, "{}.load_state_dict: the state's \"{}\" is {}; a learning rate "
                   "is >= 0", name_, base_lr_key(g), base);
  }
  const SchedulerState mine = options();
  bool any = false;
  for (auto it = state.lower_bound(kOptionPrefix);
       it != state.end() && it->first.starts_with(kOptionPrefix); ++it) {
    any = true;
    const std::string key = it->first.substr(kOptionPrefix.size());
    auto own = mine.find(key);
    LOCKSTEP_CHECK(own != mine.end(),
                   "{}.load_state_dict: the saved schedule has setting \"{}\", which this {} "
                   "does not have; build the scheduler the run was saved with",
                   name_, key, name_);
    LOCKSTEP_CHECK(own->second == it->second,
                   "{}.load_state_dict: the saved schedule has {} = {}, this one has {}; "
                   "build the scheduler with the settings of the run that saved it (the same "
                   "epochs and steps), or start a new run",
                   name_, key, it->second, own->second);
  }
  if (any) {
    for (const auto& [key, value] : mine) {
      LOCKSTEP_CHECK(state.contains(kOptionPrefix + key),
                     "{}.load_state_dict: the saved schedule has no setting \"{}\" (this one has "
                     "{}); build the scheduler the run was saved with",
                     name_, key, value);
    }
  }
  // The schedule must have a value at the saved position (one-cycle's ends
  // at total_steps): what load_state_dict() then writes.
  try {
    options_at(static_cast<int64_t>(epoch->second), saved_base_lrs(state));
  } catch (const Error& e) {
    throw Error(fmt::format("{}.load_state_dict: {}", name_, e.what()));
  }
}

void LRScheduler::load_state_dict(const SchedulerState& state) {
  check_state_dict(state);
  apply(static_cast<int64_t>(state.at("last_epoch")), saved_base_lrs(state));
}

// ---- StepLR, MultiStepLR ----------------------------------------------------------

StepLR::StepLR(Optimizer& optimizer, StepLROptions options)
    : LRScheduler("StepLR", optimizer), o_(options) {
  LOCKSTEP_CHECK(o_.step_size >= 1, "StepLR: step_size {} must be >= 1", o_.step_size);
  check_not_negative("StepLR", "gamma", o_.gamma);
  start();
}

SchedulerState StepLR::options() const {
  return {{"step_size", static_cast<double>(o_.step_size)}, {"gamma", o_.gamma}};
}

double StepLR::lr_at(int64_t epoch, double base_lr) const {
  return base_lr * std::pow(o_.gamma, static_cast<double>(epoch / o_.step_size));
}

MultiStepLR::MultiStepLR(Optimizer& optimizer, MultiStepLROptions options)
    : LRScheduler("MultiStepLR", optimizer), o_(std::move(options)) {
  LOCKSTEP_CHECK(std::is_sorted(o_.milestones.begin(), o_.milestones.end()),
                 "MultiStepLR: milestones must be in increasing order");
  check_not_negative("MultiStepLR", "gamma", o_.gamma);
  start();
}

SchedulerState MultiStepLR::options() const {
  SchedulerState s{{"gamma", o_.gamma}, {"milestones", static_cast<double>(o_.milestones.size())}};
  for (size_t i = 0; i < o_.milestones.size(); ++i)
    s[fmt::format("milestone.{}", i)] = static_cast<double>(o_.milestones[i]);
  return s;
}

double MultiStepLR::lr_at(int64_t epoch, double base_lr) const {
  const auto passed = std::upper_bound(o_.milestones.begin(), o_.milestones.end(), epoch) -
                      o_.milestones.begin();
  return base_lr * std::pow(o_.gamma, static_cast<double>(passed));
}

// ---- CosineLR, LinearLR, WarmupCosineLR ---------------------------------------------

CosineLR::CosineLR(Optimizer& optimizer, CosineLROptions options)
    : LRScheduler("CosineLR", optimizer), o_(options) {
  LOCKSTEP_CHECK(o_.t_max >= 1, "CosineLR: t_max {} must be >= 1", o_.t_max);
  check_not_negative("CosineLR", "eta_min", o_.eta_min);
  start();
}

SchedulerState CosineLR::options() const {
  return {{"t_max", static_cast<double>(o_.t_max)}, {"eta_min", o_.eta_min}};
}

double CosineLR::lr_at(int64_t epoch, double base_lr) const {
  return cosine_between(base_lr, o_.eta_min, static_cast<double>(epoch) / o_.t_max);
}

LinearLR::LinearLR(Optimizer& optimizer, LinearLROptions options)
    : LRScheduler("LinearLR", optimizer), o_(options) {
  LOCKSTEP_CHECK(o_.start_factor > 0.0 && o_.start_factor <= 1.0,
                 "LinearLR: start_factor {} must be in (0, 1]", o_.start_factor);
  LOCKSTEP_CHECK(o_.end_factor >= 0.0 && o_.end_factor <= 1.0,
                 "LinearLR: end_factor {} must be in [0, 1]", o_.end_factor);
  LOCKSTEP_CHECK(o_.total_steps >= 1, "LinearLR: total_steps {} must be >= 1", o_.total_steps);
  start();
}

SchedulerState LinearLR::options() const {
  return {{"start_factor", o_.start_factor},
          {"end_factor", o_.end_factor},
          {"total_steps", static_cast<double>(o_.total_steps)}};
}

double LinearLR::lr_at(int64_t epoch, double base_lr) const {
  const double done = static_cast<double>(std::min(epoch, o_.total_steps)) / o_.total_steps;
  return base_lr * (o_.start_factor + (o_.end_factor - o_.start_factor) * done);
}

WarmupCosineLR::WarmupCosineLR(Optimizer& optimizer, WarmupCosineLROptions options)
    : LRScheduler("WarmupCosineLR", optimizer), o_(options) {
  LOCKSTEP_CHECK(o_.warmup_steps >= 0 && o_.warmup_steps < o_.total_steps,
                 "WarmupCosineLR: need 0 <= warmup_steps < total_steps (got {} and {})",
                 o_.warmup_steps, o_.total_steps);
  LOCKSTEP_CHECK(o_.start_factor > 0.0 && o_.start_factor <= 1.0,
                 "WarmupCosineLR: start_factor {} must be in (0, 1]", o_.start_factor);
  check_not_negative("WarmupCosineLR", "eta_min", o_.eta_min);
  start();
}

SchedulerState WarmupCosineLR::options() const {
  return {{"warmup_steps", static_cast<double>(o_.warmup_steps)},
          {"total_steps", static_cast<double>(o_.total_steps)},
          {"start_factor", o_.start_factor},
          {"eta_min", o_.eta_min}};
}

double WarmupCosineLR::lr_at(int64_t epoch, double base_lr) const {
  if (epoch < o_.warmup_steps) {
    const double done = static_cast<double>(epoch) / o_.warmup_steps;
    return base_lr * (o_.start_factor + (1.0 - o_.start_factor) * done);
  }
  const double fraction =
      static_cast<double>(epoch - o_.warmup_steps) / (o_.total_steps - o_.warmup_steps);
  return cosine_between(base_lr, o_.eta_min, fraction);
}

// ---- OneCycleLR ---------------------------------------------------------------------

OneCycleLR::OneCycleLR(Optimizer& optimizer, OneCycleLROptions options)
    : LRScheduler("OneCycleLR", optimizer), o_(options) {
  LOCKSTEP_CHECK(o_.total_steps >= 2, "OneCycleLR: total_steps {} must be >= 2", o_.total_steps);
  LOCKSTEP_CHECK(o_.pct_start > 0.0 && o_.pct_start < 1.0 &&
                     o_.pct_start * static_cast<double>(o_.total_steps) > 1.0,
                 "OneCycleLR: pct_start {} must be in (0, 1) and leave the rising phase more "
                 "than one of the {} steps",
                 o_.pct_start, o_.total_steps);
  LOCKSTEP_CHECK(o_.max_lr > 0.0 && o_.div_factor > 0.0 && o_.final_div_factor > 0.0,
                 "OneCycleLR: max_lr, div_factor and final_div_factor must be > 0");
  if (o_.cycle_momentum) {
    const auto& opts = optimizer.param_groups().front().options;
    if (opts.contains("momentum"))
      momentum_key_ = "momentum";
    else if (opts.contains("beta1"))
      momentum_key_ = "beta1";
    LOCKSTEP_CHECK(!momentum_key_.empty(),
                   "OneCycleLR: the optimizer has no momentum or beta1 option to cycle; pass "
                   "cycle_momentum = false");
    // Checked here, where the settings are: the optimizer would refuse them
    // only at its next step, naming its own option and not the schedule.
    const bool beta = momentum_key_ == "beta1";
    for (const double m : {o_.base_momentum, o_.max_momentum})
      LOCKSTEP_CHECK(m >= 0.0 && (beta ? m < 1.0 : std::isfinite(m)),
                     "OneCycleLR: base_momentum {} and max_momentum {} must be {} to cycle the "
                     "optimizer's {}",
                     o_.base_momentum, o_.max_momentum, beta ? "in [0, 1)" : "finite and >= 0",
                     momentum_key_);
  }
  start();
}

SchedulerState OneCycleLR::options() const {
  return {{"max_lr", o_.max_lr},
          {"total_steps", static_cast<double>(o_.total_steps)},
          {"pct_start", o_.pct_start},
          {"cosine", o_.cosine ? 1.0 : 0.0},
          {"cycle_momentum", o_.cycle_momentum ? 1.0 : 0.0},
          {"base_momentum", o_.base_momentum},
          {"max_momentum", o_.max_momentum},
          {"div_factor", o_.div_factor},
          {"final_div_factor", o_.final_div_factor}};
}

// PyTorch's two phases: [0, pct_start * total - 1] rising, then [.., total - 1]
// falling; the last phase also covers the step total - 1 reaches.
double OneCycleLR::anneal(int64_t epoch, double start_value, double peak_value,
                          double end_value) const {
  LOCKSTEP_CHECK(epoch <= o_.total_steps,
                 "OneCycleLR: stepped {} times but total_steps is {}; make the scheduler with "
                 "the number of steps the run takes",
                 epoch, o_.total_steps);
  const double rise_end = o_.pct_start * static_cast<double>(o_.total_steps) - 1.0;
  const double fall_end = static_cast<double>(o_.total_steps) - 1.0;
  const double e = static_cast<double>(epoch);
  double from, to, fraction;
  if (e <= rise_end) {
    from = start_value, to = peak_value, fraction = e / rise_end;
  } else {
    // At total_steps, the position after the last step, PyTorch extrapolates
    // the last phase (to a negative rate when linear); it holds the end value
    // here, which the optimizer accepts (a checkpoint of a finished run loads).
    from = peak_value, to = end_value,
    fraction = std::min(1.0, (e - rise_end) / (fall_end - rise_end));
  }
  return o_.cosine ? cosine_between(from, to, fraction) : (to - from) * fraction + from;
}

double OneCycleLR::lr_at(int64_t epoch, double /*base_lr*/) const {
  const double initial = o_.max_lr / o_.div_factor;
  return anneal(epoch, initial, o_.max_lr, initial / o_.final_div_factor);
}

void OneCycleLR::apply_extra(int64_t epoch, GroupOptions& options) const {
  if (momentum_key_.empty()) return;
  options[momentum_key_] = anneal(epoch, o_.max_momentum, o_.base_momentum, o_.max_momentum);
}

}  // namespace lockstep::optim
