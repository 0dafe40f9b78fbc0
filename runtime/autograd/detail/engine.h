// Internal: the backward pass over the recorded graph.
#pragma once

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

// Runs backward from `root` seeded with `grad` (same shape as root). Frees the
// graph's saved tensors unless retain_graph.
void run_backward(const Tensor& root, const Tensor& grad, bool retain_graph);

}  // namespace lockstep::runtime
