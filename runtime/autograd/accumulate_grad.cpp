#include "lockstep/runtime/autograd/detail/accumulate_grad.h"

#include <mutex>

#include "lockstep/runtime/autograd/detail/meta.h"

namespace lockstep::runtime {

AccumulateGrad::AccumulateGrad(const Tensor& leaf) : Node("AccumulateGrad"), leaf_(leaf) {}

std::vector<Tensor> AccumulateGrad::apply(const Tensor& incoming) {
  AutogradMeta& meta = autograd_meta(*leaf_.impl_ptr());
  // As PyTorch: a leaf frozen (requires_grad_(false)) after the forward that
  // recorded it takes no gradient, and its hooks do not fire.
  if (!meta.requires_grad) return {};
  std::unique_lock<std::mutex> lock(meta.grad_mutex);
  // The register_hook hooks first: what they return is what is accumulated
  // (and what the post-accumulate hooks, DDP's reducer among them, see).
  Tensor hooked;
  if (!meta.grad_hooks.empty()) {
    // Copied and run unlocked, as the post-accumulate hooks below.
    auto grad_hooks = meta.grad_hooks;
    lock.unlock();
    hooked = run_grad_hooks(grad_hooks, incoming, "a leaf of shape " + shape_str(leaf_.shape()));
    lock.lock();
  }
  const Tensor& grad_output = hooked.defined() ? hooked : incoming;
  LOCKSTEP_CHECK(grad_output.shape() == leaf_.shape(),
                 "gradient of shape {} does not match the leaf's shape {}",
                 shape_str(grad_output.shape()), shape_str(leaf_.shape()));
  if (!meta.grad.defined()) {
    // Take the incoming buffer when nobody else can see it (the usual case for
    // a parameter used once); otherwise copy, so that later in-place
    // accumulation never writes through an alias.
    bool sole_owner = grad_output.use_count() == 1 && grad_output.storage().use_count() == 1 &&
                      grad_output.impl_ptr()->autograd == nullptr &&
                      grad_output.is_contiguous() && grad_output.dtype() == leaf_.dtype();
    meta.grad = sole_owner ? grad_output : grad_output.to(leaf_.dtype()).clone();
  } else {
    meta.grad.add_(grad_output);
  }
  // Copy the list: a hook may register or remove hooks. Hooks run unlocked:
  // one may itself run a backward that reaches this leaf.
  auto hooks = meta.post_accumulate_hooks;
  lock.unlock();
  for (auto& [id, fn] : hooks) fn(leaf_);
  return {};
}

}  // namespace lockstep::runtime
