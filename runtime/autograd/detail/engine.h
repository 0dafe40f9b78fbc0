// Internal: the backward pass over the recorded graph.
#pragma once

#include <cstddef>
#include <memory>
#include <unordered_map>
#include <vector>

#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

// Runs backward from `root` seeded with `grad` (same shape as root). Frees the
// graph's saved tensors unless retain_graph.
void run_backward(const Tensor& root, const Tensor& grad, bool retain_graph);

// What autograd::grad asks of a pass instead of accumulating: the gradient
// flowing into node `n` (summed, before its tensor hooks, as PyTorch 1.13
// captures it) goes to grads[i] for each i in at[n]. Only the nodes from
// which such a node is reached run; no AccumulateGrad does.
struct GradCapture {
  std::unordered_map<Node*, std::vector<size_t>> at;
  std::vector<Tensor> grads;
};

// Runs the graph below `root_node`, seeded with `seed` (the argument of its
// apply()). With `capture`, as described there; without, as run_backward.
void run_graph(const std::shared_ptr<Node>& root_node, const Tensor& seed, bool retain_graph,
               GradCapture* capture);

}  // namespace lockstep::runtime
