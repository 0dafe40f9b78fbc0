// autograd::grad: gradients of outputs with respect to chosen inputs, as
// torch.autograd.grad, without touching any tensor's .grad.
#pragma once

#include <vector>

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::autograd {

struct GradOptions {
  // One per output (its shape); may be empty (or hold undefined tensors) for
  // one-element outputs, which are then seeded with ones.
  std::vector<Tensor> grad_outputs;
  bool retain_graph = false;  // false frees the saved tensors of the nodes that ran
  bool allow_unused = false;  // true: an input the outputs do not depend on gets undefined
  bool create_graph = false;  // double backward: not supported, refused
};

// Returns d(sum of outputs . grad_outputs)/d(input) for each input, in order.
// Runs only the part of the graph between the outputs and the inputs: no
// AccumulateGrad runs, so no .grad changes and no post-accumulate hook (nor
// DDP's reducer) fires, and a leaf input's register_hook hooks do not run. A
// computed input's gradient is taken before its own hooks run, which still
// change what flows further back (PyTorch 1.13's behaviour). Every input must
// require grad; an input the outputs do not depend on is an error unless
// allow_unused.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const GradOptions& options = {});

}  // namespace lockstep::runtime::autograd
