// GradScaler: loss scaling for f16 training, as torch.amp.GradScaler.
//
//   optim::GradScaler scaler(group);          // group: optional, see below
//   for (...) {
//     opt.zero_grad();
//     scaler.scale(loss).backward();
//     scaler.unscale_(opt);                   // optional: before clipping
//     optim::clip_grad_norm(params, 1.0);
//     scaler.step(opt);                       // skipped if a gradient was inf/NaN
//     scaler.update();
//   }
//
// The scale is a 1-element f32 tensor on the loss's device (made by the first
// scale()). unscale_ multiplies every gradient by 1/scale in one pass per
// tensor that also flags inf/NaN (runtime/ops/amp.h). update() backs the scale
// off by backoff_factor after an overflow, and grows it by growth_factor
// after growth_interval clean iterations; it runs on the device, but step()
// reads the flag on the host once (as PyTorch does) to decide whether to step.
//
// Ranks must agree on a skip. DDP's averaged gradients carry an inf/NaN to
// every rank, but gradients under no_sync(), reduced by the program itself, or
// only partly read by a sharded optimizer need not. With a group, unscale_
// all-reduces the flag (max) before deciding: one 1-element all-reduce per
// optimizer per iteration (a few µs over shm or NCCL, ~0.3 ms over gloo), and
// then unscale_ and step are collective calls: every rank makes them in the
// same order. Without a group everything is local.
//
// Gradients must be f32, f64 or bf16: f16 gradients throw, as in PyTorch
// (keep f32 master parameters; autocast casts them per op).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "lockstep/collectives/process_group.h"
#include "lockstep/optim/optimizer.h"

namespace lockstep::optim {

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;  // false: every call passes through (scale 1)
};

// PyTorch's keys: "scale", "growth_factor", "backoff_factor",
// "growth_interval", "_growth_tracker". Numbers only, so a training
// checkpoint keeps it in its metadata. Empty for a disabled scaler.
using GradScalerState = std::map<std::string, double>;

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});
  GradScaler(std::shared_ptr<collectives::ProcessGroup> group, GradScalerOptions options = {});

  // loss * scale, differentiable.
  Tensor scale(const Tensor& loss);
  // Divides the optimizer's gradients by the scale in place and records
  // whether any was inf/NaN (all-reduced with a group). Once per optimizer
  // between update()s, and not after step().
  void unscale_(Optimizer& optimizer);
  // unscale_ unless done; then optimizer.step() unless an inf/NaN was found.
  // Returns whether it stepped. Once per optimizer between update()s. As
  // PyTorch, throws where none of the optimizer's parameters has a gradient
  // (with a group: on any rank, and then on every rank).
  bool step(Optimizer& optimizer);
  // The next iteration's scale (see above); forgets the iteration's flags.
  void update();
  // Sets the scale instead; the growth tracker is kept.
  void update(double new_scale);

  double get_scale() const;  // waits for the device; 1 when disabled
  int64_t get_growth_tracker() const;
  bool is_enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

  GradScalerState state_dict() const;
  // Throws, naming what is wrong, unless `state` could be loaded.
  void check_state_dict(const GradScalerState& state) const;
  // Takes the scale, the tracker and the factors; checks first.
  void load_state_dict(const GradScalerState& state);

 private:
  enum class Stage { ready, unscaled, stepped };
  struct PerOptimizer {
    Stage stage = Stage::ready;
    Tensor found_inf;  // 1-element f32 on the scale's device: flags[0]
    Tensor flags;      // [found inf/NaN, a rank had no gradient], all-reduced with a group
    bool has_grads = false;  // this rank's unscale_ found a gradient
    // Each parameter and the .grad that unscale_ divided: a later scale()
    // finds whether they were replaced since (GradScaler::scale).
    std::vector<std::pair<Tensor, Tensor>> unscaled;
    // The optimizer's zero_grad() count then, and the count itself: a
    // zero_grad(set_to_none=false) keeps each .grad, zeroed in place.
    std::shared_ptr<const uint64_t> zero_grads;
    uint64_t zero_grads_at_unscale = 0;
  };

  GradScalerOptions options_;
  std::shared_ptr<collectives::ProcessGroup> group_;
  Tensor scale_;            // f32 [1], made by the first scale()
  Tensor growth_tracker_;   // i32 [1], beside it
  int64_t init_growth_tracker_ = 0;  // until scale_ exists
  std::unordered_map<const Optimizer*, PerOptimizer> per_optimizer_;
};

}  // namespace lockstep::optim
