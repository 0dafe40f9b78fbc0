// Internal: the autograd state of one tensor.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

struct AutogradMeta {
  bool requires_grad = false;  // for leaves; non-leaves require grad via grad_fn
  Tensor grad;
  // Guards `grad` and the hooks below (and next_hook_id): backward passes on
  // several threads (graphs that share a parameter) accumulate into one leaf.
  std::mutex grad_mutex;
  std::shared_ptr<Node> grad_fn;
  // A leaf's AccumulateGrad node, shared by every graph that uses the leaf;
  // weak so that a finished graph frees it. Guarded: threads recording ops on
  // one leaf at once (autograd lanes) must get the same node, or its gradient
  // would be summed in two nodes, in whichever order they ran.
  std::weak_ptr<Node> grad_accumulator;
  std::mutex grad_accumulator_mutex;
  std::vector<std::pair<int64_t, PostAccumulateGradHook>> post_accumulate_hooks;
  // A leaf's register_hook hooks, run before accumulation (a computed
  // tensor's live on its grad_fn node).
  std::vector<std::pair<int64_t, GradHook>> grad_hooks;
  int64_t next_hook_id = 0;
};

// The node that receives the gradient of `t`: its grad_fn, its (possibly new)
// AccumulateGrad node when it is a leaf that requires grad, else null.
std::shared_ptr<Node> gradient_edge(const Tensor& t);

// Makes `out` (a fresh tensor) the output of `fn`.
void set_grad_fn(const Tensor& out, std::shared_ptr<Node> fn);

AutogradMeta& autograd_meta(TensorImpl& impl);  // creates it when absent

}  // namespace lockstep::runtime
