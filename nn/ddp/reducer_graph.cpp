// The reducer's walks of the backward pass running on this thread: which
// parameters it can reach (the unused-parameter search), which armed
// forwards' outputs it goes through, and whether a no_sync() backward goes
// back through outputs an averaged backward already went through.
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>

#include "lockstep/nn/ddp/reducer.h"
#include "lockstep/nn/detail/drop_guard.h"
#include "lockstep/runtime/autograd/backward_callbacks.h"
#include "lockstep/runtime/autograd/detail/accumulate_grad.h"
#include "lockstep/runtime/error.h"

namespace lockstep::nn {

namespace {

// Visits each node the backward passes running on this thread can reach,
// once, until `visit` returns true; says whether it did.
template <class Visit>
bool walk_running_graph(Visit&& visit) {
  std::unordered_set<const runtime::Node*> seen;
  std::vector<const runtime::Node*> stack = runtime::running_backward_roots();
  while (!stack.empty()) {
    const runtime::Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    if (visit(node)) return true;
    for (const auto& next : node->next) {
      if (next) stack.push_back(next.get());
    }
  }
  return false;
}

}  // namespace

// The parameters this backward can give a gradient to: those its graph
// reaches from the node it started from (and from those of the passes it
// runs inside, or that run inside it so far). Walked from the backward itself,
// not from forward's outputs, so a loss over several forwards (two towers of
// one model called apart, a forward and a no_sync() one) reaches what each
// used, an output the loss leaves out counts for nothing, and a forward whose
// output is kept but never backpropagated adds nothing.
std::unordered_set<const runtime::TensorImpl*> Reducer::reachable_leaves() const {
  std::unordered_set<const runtime::TensorImpl*> leaves;
  walk_running_graph([&](const runtime::Node* node) {
    if (const auto* acc = dynamic_cast<const runtime::AccumulateGrad*>(node)) {
      leaves.insert(acc->leaf().impl_ptr());
    }
    return false;
  });
  return leaves;
}

// The armed forwards' outputs that this (averaged) backward goes through.
std::vector<std::weak_ptr<runtime::Node>> Reducer::armed_outputs_reached() const {
  std::unordered_map<const runtime::Node*, std::weak_ptr<runtime::Node>> armed;
  for (const auto& weak : armed_graph_)
    if (const auto node = weak.lock()) armed.emplace(node.get(), weak);
  std::vector<std::weak_ptr<runtime::Node>> out;
  walk_running_graph([&](const runtime::Node* node) {
    if (const auto it = armed.find(node); it != armed.end()) {
      out.push_back(it->second);
      armed.erase(it);
    }
    return armed.empty();
  });
  return out;
}

// A backward that accumulates locally after an averaged one (a no_sync()
// forward came while that one was armed) may go through the no_sync()
// forwards' outputs only. Through an output the averaged backward already
// went through (the retained graph of one loss over both forwards,
// backpropagated again), its gradients would be added a second time,
// unaveraged, where a second backward through one forward is refused
// elsewhere. Checked once per backward pass, on its first gradient.
void Reducer::check_not_averaged_again(const std::string& name) {
  std::unordered_set<const runtime::Node*> spent;
  for (const auto& weak : averaged_outputs_)
    if (const auto node = weak.lock()) spent.insert(node.get());
  if (spent.empty()) {  // that graph is gone: no backward can go through it again
    averaged_outputs_.clear();
    return;
  }
  pass_checked_ = true;
  // Cleared when the pass ends, whether its callbacks run or are dropped.
  auto clear = std::make_shared<detail::DropGuard>([this] { pass_checked_ = false; });
  runtime::queue_outermost_backward_callback([clear] {});
  if (walk_running_graph([&](const runtime::Node* node) { return spent.count(node) > 0; })) {
    throw Error(fmt::format(
        "DistributedDataParallel on rank {}: parameter '{}' received a gradient through the "
        "output of a forward that the last averaged backward already went through (a second "
        "backward through one loss, its graph retained). Only the no_sync() forwards that came "
        "after it accumulate locally until the next averaged backward; run a new ddp.forward() "
        "for every backward",
        group_.rank(), name));
  }
}

}  // namespace lockstep::nn
