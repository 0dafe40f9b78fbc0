// Optimizer: the base of SGD (and of Adam, AdamW, ... later), shaped like
// torch.optim.Optimizer.
//
// Hyper-parameters live per parameter group as name -> number maps, like the
// dicts in PyTorch's param_groups (flags stored as 0/1). That keeps one code
// path for every optimizer in LR schedulers (`param_groups()[0].options["lr"]`)
// and in checkpoints. Each optimizer still takes a typed options struct and
// checks every group's values, at construction and at each step.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "lockstep/runtime/tensor.h"

namespace lockstep::optim {

using runtime::Tensor;
using GroupOptions = std::map<std::string, double>;

struct ParamGroup {
  std::vector<Tensor> params;
  // When adding a group: only the keys that differ from the optimizer's
  // defaults; the rest are filled in.
  GroupOptions options;
};

// PyTorch's optimizer state_dict. Parameters are numbered 0, 1, ... across
// the groups in order; `state` holds per-parameter tensors (e.g.
// "momentum_buffer") keyed by that number, and each group lists its options
// and its parameters' numbers.
struct OptimizerState {
  struct Group {
    GroupOptions options;
    std::vector<int64_t> params;
  };
  std::map<int64_t, std::map<std::string, Tensor>> state;
  std::vector<Group> param_groups;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient, under no-grad.
  virtual void step() = 0;
  // set_to_none (the default, as PyTorch): drop the gradients; else zero them.
  void zero_grad(bool set_to_none = true);
  // How many times zero_grad() has run, shared so that a holder (GradScaler)
  // may outlive the optimizer: a gradient zeroed in place is the same tensor.
  std::shared_ptr<const uint64_t> zero_grad_count() const { return zero_grads_; }

  // "SGD", "Adam", ...: for messages and checkpoints.
  const std::string& name() const { return name_; }

  // Parameters must be floating-point leaf tensors, in no other group.
  virtual void add_param_group(ParamGroup group);
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }

  // The state tensors are the optimizer's own (not copies): save or clone them.
  // Virtual: a sharded optimizer answers with its consolidated state.
  virtual OptimizerState state_dict() const;
  // Takes the groups' options and clones the state onto the parameters'
  // device, and every floating entry but "step" onto the parameter's dtype
  // (PyTorch's rule, 0-dim entries of a scalar parameter included). The groups
  // must match in count and size, each entry pass check_state_entry() and
  // each parameter's entries check_state_keys(); checked first, nothing
  // changes on error.
  virtual void load_state_dict(const OptimizerState& saved);
  // Throws, naming `what` ("Adam.load_state_dict"), unless `entries`, the
  // saved state of parameter `index`, is this optimizer's kind: no key it
  // does not keep (another optimizer's state), and either none or all of the
  // keys its update reads together (Adam's count without its moments, or the
  // reverse, would silently restart the bias correction). Every key passes
  // by default. load_state_dict runs it per parameter, a sharded optimizer
  // with its inner optimizer's rule.
  virtual void check_state_keys(std::string_view what, int64_t index,
                                const std::map<std::string, Tensor>& entries) const;

 protected:
  Optimizer(std::string name, GroupOptions defaults)
      : name_(std::move(name)), defaults_(std::move(defaults)) {}
  // add_param_group of each group in order, for constructors: the parameters
  // already grouped are gathered once, not once per group.
  void add_param_groups(std::vector<ParamGroup> groups);
  // Throws a clear Error if a group's options are invalid.
  virtual void validate(const GroupOptions& options) const = 0;
  // Per-parameter state, created empty on first use.
  std::map<std::string, Tensor>& state_of(const Tensor& param) { return state_[param.impl_ptr()]; }
  // The state of `param`, or null while it has none (creates nothing).
  const std::map<std::string, Tensor>* find_state(const Tensor& param) const {
    const auto it = state_.find(param.impl_ptr());
    return it == state_.end() ? nullptr : &it->second;
  }

  const std::string name_;
  const GroupOptions defaults_;
  std::vector<ParamGroup> groups_;

 private:
  // Keyed by the parameter's TensorImpl: identity, as PyTorch keys by the
  // Parameter object (Module::to keeps it).
  std::unordered_map<const runtime::TensorImpl*, std::map<std::string, Tensor>> state_;
  std::shared_ptr<uint64_t> zero_grads_ = std::make_shared<uint64_t>(0);
  // Checks `group` against the parameters in `seen` (those already grouped,
  // to which it adds its own), fills in its defaults and appends it.
  void add_checked(ParamGroup group, std::unordered_set<const runtime::TensorImpl*>& seen);

  // The name of the LR scheduler that drives this optimizer's "lr", empty
  // while none does (lr_scheduler.h: one at a time). Shared with that
  // scheduler, so either may be destroyed first.
  friend class LRScheduler;
  std::shared_ptr<std::string> scheduler_ = std::make_shared<std::string>();
  // Held by this optimizer alone: a scheduler watches it to know that the
  // optimizer it drives still exists.
  std::shared_ptr<const bool> lifetime_ = std::make_shared<const bool>(true);
};

// The rule every optimizer state load checks each entry with, before
// anything changes: `value`, saved as state `key` of parameter `index`
// (which is `param` here), must be defined; "step" must be a 0-dim count
// (a whole number >= 0);
// any other entry is per-element state (a momentum buffer, a moment), which
// must have the parameter's shape and a floating dtype (it is loaded in the
// parameter's dtype). Optimizer::load_state_dict runs it on its parameters;
// ZeroRedundancyOptimizer on every rank against the whole parameters, so
// that all ranks refuse a state alike. `what` starts the message
// ("SGD.load_state_dict").
void check_state_entry(std::string_view what, int64_t index, const std::string& key,
                       const Tensor& value, const Tensor& param);

}  // namespace lockstep::optim
