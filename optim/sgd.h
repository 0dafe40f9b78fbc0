// SGD with momentum, dampening, Nesterov and weight decay: torch.optim.SGD's
// exact update rule (torch/optim/sgd.py, _single_tensor_sgd). Per parameter
// p with gradient g, at each step():
//
//   g   = maximize ? -g : g
//   g   = g + weight_decay * p                       (if weight_decay != 0)
//   if momentum != 0:
//     buf = g (a copy)                               on the first step
//     buf = momentum * buf + (1 - dampening) * g     after
//     g   = nesterov ? g + momentum * buf : buf
//   p   = p - lr * g
//
// Parameters whose gradient is undefined are skipped (their buffers too).
#pragma once

#include <vector>

#include "lockstep/optim/optimizer.h"

namespace lockstep::optim {

struct SGDOptions {
  double lr = 1e-3;  // torch.optim.SGD's default
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;  // needs momentum > 0 and dampening == 0
  bool maximize = false;

  GroupOptions to_map() const;
  static SGDOptions from_map(const GroupOptions& options);
};

class SGD : public Optimizer {
 public:
  explicit SGD(std::vector<Tensor> params, SGDOptions options = {});
  // Groups with their own options, e.g. {{.params = head, .options = {{"lr", 0.1}}}}.
  explicit SGD(std::vector<ParamGroup> groups, SGDOptions defaults = {});

  // In place: on the CPU one fused loop per parameter over its contiguous
  // data (f32 and f64 computed in their own type, bf16 and f16 in f32 and
  // rounded once when stored, as PyTorch's fused kernels); on CUDA one kernel
  // launch for all parameters of a device (f32). Every parameter, gradient
  // and buffer is checked first: a step that throws has changed nothing.
  void step() override;
  // Its state: "momentum_buffer" only (optimizer.h).
  void check_state_keys(std::string_view what, int64_t index,
                        const std::map<std::string, Tensor>& entries) const override;

 protected:
  void validate(const GroupOptions& options) const override;
};

}  // namespace lockstep::optim
