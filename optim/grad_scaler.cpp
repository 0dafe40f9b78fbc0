#include "lockstep/optim/grad_scaler.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <vector>

#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops/amp.h"
#include "lockstep/runtime/ops/elementwise.h"

namespace lockstep::optim {

using runtime::Device;
using runtime::DType;
using runtime::NoGradGuard;

namespace {

// The scale lives in an f32 tensor: a larger one would be an infinity there,
// every step's gradients inf, and every step skipped without end.
bool valid_scale(double scale) {
  return scale > 0 && scale <= std::numeric_limits<float>::max();
}

void check_settings(double scale, double growth_factor, double backoff_factor,
                    double growth_interval, const char* where) {
  LOCKSTEP_CHECK(valid_scale(scale), "{}: the scale must be > 0 and finite in f32 (at most {}), "
                 "got {}", where, std::numeric_limits<float>::max(), scale);
  LOCKSTEP_CHECK(growth_factor > 1.0 && std::isfinite(growth_factor),
                 "{}: growth_factor must be > 1, got {}", where, growth_factor);
  LOCKSTEP_CHECK(backoff_factor > 0.0 && backoff_factor < 1.0,
                 "{}: backoff_factor must be in (0, 1), got {}", where, backoff_factor);
  LOCKSTEP_CHECK(growth_interval >= 1 && growth_interval <= INT32_MAX &&
                     growth_interval == std::floor(growth_interval),
                 "{}: growth_interval must be an integer in [1, 2^31), got {}", where,
                 growth_interval);
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : GradScaler(nullptr, options) {}

GradScaler::GradScaler(std::shared_ptr<collectives::ProcessGroup> group, GradScalerOptions options)
    : options_(options), group_(std::move(group)) {
  if (options_.enabled)
    check_settings(options_.init_scale, options_.growth_factor, options_.backoff_factor,
                   static_cast<double>(options_.growth_interval), "GradScaler");
}

Tensor GradScaler::scale(const Tensor& loss) {
  if (!options_.enabled) return loss;
  LOCKSTEP_CHECK(loss.defined(), "GradScaler::scale: the loss is undefined");
  if (!scale_.defined()) {
    // 0-dim, as PyTorch's: a 0-dim loss stays 0-dim once scaled.
    scale_ = Tensor::full({}, options_.init_scale, DType::f32, loss.device());
    growth_tracker_ = Tensor::full({}, static_cast<double>(init_growth_tracker_), DType::i32,
                                   loss.device());
  }
  LOCKSTEP_CHECK(scale_.device() == loss.device(),
                 "GradScaler::scale: the loss is on {}, the scale on {}; one scaler per device",
                 loss.device().str(), scale_.device().str());
  // A loss to scale starts a backward of new scaled gradients. An optimizer
  // unscaled but not stepped whose gradients were dropped since (zero_grad)
  // belongs to an iteration that an error ended (in clipping after unscale_,
  // in optimizer.step()) and that the loop skipped: its flags are that
  // iteration's, and step() would step the new gradients without dividing
  // them (as PyTorch's does); forget them, as update() would. Dropped: each
  // .grad replaced, or zeroed in place by the optimizer's zero_grad(). Gradients
  // still there may be another model's, unscaled before this loss's backward
  // on purpose, and stay unscaled.
  std::erase_if(per_optimizer_, [](const auto& entry) {
    const PerOptimizer& state = entry.second;
    const bool zeroed = state.zero_grads && *state.zero_grads != state.zero_grads_at_unscale;
    return state.stage == Stage::unscaled &&
           (zeroed ||
            std::any_of(state.unscaled.begin(), state.unscaled.end(), [](const auto& pair) {
              return !pair.first.grad().is_same(pair.second);
            }));
  });
  return runtime::mul(loss, scale_);
}

void GradScaler::unscale_(Optimizer& optimizer) {
  if (!options_.enabled) return;
  LOCKSTEP_CHECK(scale_.defined(),
                 "GradScaler::unscale_: there is no scale yet; call scale(loss) earlier in the "
                 "iteration");
  PerOptimizer& state = per_optimizer_[&optimizer];
  LOCKSTEP_CHECK(state.stage != Stage::unscaled,
                 "GradScaler::unscale_: unscale_() has already been called on this optimizer "
                 "since the last update()");
  LOCKSTEP_CHECK(state.stage != Stage::stepped,
                 "GradScaler::unscale_: unscale_() is being called after step()");
  std::vector<Tensor> grads;
  state.unscaled.clear();
  state.zero_grads = optimizer.zero_grad_count();
  state.zero_grads_at_unscale = *state.zero_grads;
  for (const ParamGroup& group : optimizer.param_groups()) {
    for (const Tensor& p : group.params) {
      const Tensor& g = p.grad();
      if (!g.defined()) continue;
      LOCKSTEP_CHECK(g.dtype() != DType::f16,
                     "GradScaler::unscale_: attempting to unscale f16 gradients; keep the "
                     "parameters in f32 (autocast casts them per op)");
      LOCKSTEP_CHECK(g.device() == scale_.device(),
                     "GradScaler::unscale_: a gradient is on {}, the scale on {}",
                     g.device().str(), scale_.device().str());
      grads.push_back(g);
      state.unscaled.emplace_back(p, g);
    }
  }
  NoGradGuard no_grad;
  // PyTorch's inverse: in double, rounded to f32; on the device, no sync.
  const Device device = scale_.device();
  const Tensor inv_scale =
      runtime::div(Tensor::ones({1}, DType::f64, device), scale_.to(DType::f64)).to(DType::f32);
  // [found inf/NaN, no gradient here]: reduced together, so that every rank
  // learns in the one all-reduce whether any rank has nothing to step.
  Tensor flags = Tensor::zeros({2}, DType::f32, device);
  Tensor found_inf = flags.slice(0, 0, 1);
  if (grads.empty()) flags.slice(0, 1, 2).fill_(1.0);
  runtime::amp_unscale_(grads, found_inf, inv_scale);
  if (group_) group_->allreduce(flags, {.op = collectives::ReduceOp::Max})->wait();
  state.found_inf = found_inf;
  state.flags = flags;
  state.has_grads = !grads.empty();
  state.stage = Stage::unscaled;
}

bool GradScaler::step(Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  LOCKSTEP_CHECK(scale_.defined(),
                 "GradScaler::step: there is no scale yet; call scale(loss).backward() before "
                 "step()");
  LOCKSTEP_CHECK(per_optimizer_[&optimizer].stage != Stage::stepped,
                 "GradScaler::step: step() has already been called since the last update()");
  if (per_optimizer_[&optimizer].stage == Stage::ready) unscale_(optimizer);
  PerOptimizer& state = per_optimizer_[&optimizer];
  // The one host read of an iteration (waits for the device).
  const std::vector<float> flags = state.flags.to_vector<float>();
  // As PyTorch: a step with nothing to step is a mistake in the loop, not a
  // clean iteration that would let update() grow the scale.
  LOCKSTEP_CHECK(flags[1] == 0.0f,
                 "GradScaler::step: No inf checks were recorded for this optimizer: none of its "
                 "parameters has a gradient {}, so there is nothing to step. Run "
                 "scale(loss).backward() before step(), and zero_grad() before the backward, not "
                 "between it and step()",
                 state.has_grads ? "on another rank of the scaler's group" : "on this rank");
  const bool skip = flags[0] != 0.0f;
  if (!skip) optimizer.step();
  state.stage = Stage::stepped;
  return !skip;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  LOCKSTEP_CHECK(scale_.defined(),
                 "GradScaler::update: there is no scale yet; call scale(loss) first");
  NoGradGuard no_grad;
  Tensor found;
  for (const auto& [opt, state] : per_optimizer_) {
    if (!state.has_grads) continue;  // as PyTorch: unscale_ found nothing to check
    if (!found.defined()) found = state.found_inf.clone();
    else found.add_(state.found_inf);
  }
  LOCKSTEP_CHECK(found.defined(),
                 "GradScaler::update: no inf checks were recorded prior to update(); call "
                 "step(optimizer) or unscale_(optimizer) first");
  runtime::amp_update_scale_(scale_, growth_tracker_, found, options_.growth_factor,
                             options_.backoff_factor, options_.growth_interval);
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  LOCKSTEP_CHECK(valid_scale(new_scale),
                 "GradScaler::update: the new scale must be > 0 and finite in f32 (at most {}), "
                 "got {}", std::numeric_limits<float>::max(), new_scale);
  if (scale_.defined()) {
    NoGradGuard no_grad;
    scale_.fill_(new_scale);
  } else {
    options_.init_scale = new_scale;
  }
  per_optimizer_.clear();
}

double GradScaler::get_scale() const {
  if (!options_.enabled) return 1.0;
  return scale_.defined() ? scale_.item() : options_.init_scale;
}

int64_t GradScaler::get_growth_tracker() const {
  if (!options_.enabled) return 0;
  return scale_.defined() ? static_cast<int64_t>(growth_tracker_.item()) : init_growth_tracker_;
}

GradScalerState GradScaler::state_dict() const {
  if (!options_.enabled) return {};
  return {{"scale", get_scale()},
          {"growth_factor", options_.growth_factor},
          {"backoff_factor", options_.backoff_factor},
          {"growth_interval", static_cast<double>(options_.growth_interval)},
          {"_growth_tracker", static_cast<double>(get_growth_tracker())}};
}

void GradScaler::check_state_dict(const GradScalerState& state) const {
  if (!options_.enabled) return;
  LOCKSTEP_CHECK(!state.empty(),
                 "GradScaler::load_state_dict: the state is empty, possibly because it was saved "
                 "from a disabled GradScaler");
  for (const char* key :
       {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"})
    LOCKSTEP_CHECK(state.contains(key), "GradScaler::load_state_dict: the state has no \"{}\"",
                   key);
  check_settings(state.at("scale"), state.at("growth_factor"), state.at("backoff_factor"),
                 state.at("growth_interval"), "GradScaler::load_state_dict");
  const double tracker = state.at("_growth_tracker");
  LOCKSTEP_CHECK(tracker >= 0 && tracker < state.at("growth_interval") &&
                     tracker == std::floor(tracker),
                 "GradScaler::load_state_dict: _growth_tracker must be an integer in [0, "
                 "growth_interval), got {}",
                 tracker);
}

void GradScaler::load_state_dict(const GradScalerState& state) {
  if (!options_.enabled) return;
  check_state_dict(state);
  options_.init_scale = state.at("scale");
  options_.growth_factor = state.at("growth_factor");
  options_.backoff_factor = state.at("backoff_factor");
  options_.growth_interval = static_cast<int64_t>(state.at("growth_interval"));
  init_growth_tracker_ = static_cast<int64_t>(state.at("_growth_tracker"));
  if (scale_.defined()) {
    NoGradGuard no_grad;
    scale_.fill_(options_.init_scale);
    growth_tracker_.fill_(static_cast<double>(init_growth_tracker_));
  }
}

}  // namespace lockstep::optim
