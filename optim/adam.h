// Adam and AdamW: torch.optim.Adam's and torch.optim.AdamW's update rules
// (torch/optim/adam.py and adamw.py, _single_tensor_*). Per parameter p with
// gradient g, at step t = 1, 2, ...:
//
//   g   = maximize ? -g : g
//   Adam:  g = g + weight_decay * p                  (L2 penalty in the gradient)
//   AdamW: p = p * (1 - lr * weight_decay)           (decoupled decay)
//   m   = beta1 * m + (1 - beta1) * g                "exp_avg"
//   v   = beta2 * v + (1 - beta2) * g * g            "exp_avg_sq"
//   vmax = max(vmax, v)                              "max_exp_avg_sq", amsgrad only
//   denom = sqrt(amsgrad ? vmax : v) / sqrt(1 - beta2^t) + eps
//   p   = p - lr / (1 - beta1^t) * m / denom
//
// State per parameter, under PyTorch's names: "step" (a 0-dim f32 tensor,
// advanced in place like the moments), "exp_avg", "exp_avg_sq", and
// "max_exp_avg_sq" with amsgrad (max as torch.maximum: NaN if either is).
// Parameters whose gradient is undefined are skipped (their state too).
#pragma once

#include <vector>

#include "lockstep/optim/optimizer.h"

namespace lockstep::optim {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // AdamW's default is 1e-2: see AdamW below
  bool amsgrad = false;
  bool maximize = false;

  GroupOptions to_map() const;
  static AdamOptions from_map(const GroupOptions& options);
};

class Adam : public Optimizer {
 public:
  explicit Adam(std::vector<Tensor> params, AdamOptions options = {});
  explicit Adam(std::vector<ParamGroup> groups, AdamOptions defaults = {});

  // In place: on the CPU one fused loop per parameter over its contiguous
  // data (f32 and f64 computed in their own type, bf16 and f16 in f32 and
  // rounded once when stored, as PyTorch's fused kernels); on CUDA one kernel
  // launch for all parameters of a device (f32). Every parameter, gradient
  // and buffer is checked first: a step that throws has changed nothing.
  void step() override;
  // Its state: "step", "exp_avg", "exp_avg_sq" (all or none), "max_exp_avg_sq"
  // (made by the first amsgrad step) (optimizer.h).
  void check_state_keys(std::string_view what, int64_t index,
                        const std::map<std::string, Tensor>& entries) const override;

 protected:
  // For AdamW: same state and options, decoupled weight decay.
  Adam(std::string name, bool decoupled_weight_decay, AdamOptions defaults);
  void validate(const GroupOptions& options) const override;

 private:
  bool decoupled_weight_decay_ = false;
};

// AdamW: Adam with decoupled weight decay; weight_decay defaults to 1e-2 as in
// torch.optim.AdamW.
struct AdamWOptions : AdamOptions {
  AdamWOptions() { weight_decay = 1e-2; }
};

class AdamW : public Adam {
 public:
  explicit AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  explicit AdamW(std::vector<ParamGroup> groups, AdamWOptions defaults = {});
};

}  // namespace lockstep::optim
