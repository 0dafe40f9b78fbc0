#include "lockstep/optim/optimizer.h"

#include <cmath>
#include <unordered_set>

#include <fmt/format.h>

#include "lockstep/optim/update_helpers.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/error.h"

namespace lockstep::optim {

using runtime::NoGradGuard;

namespace {

std::string key_list(const GroupOptions& options) {
  std::string out;
  for (const auto& [k, v] : options) out += (out.empty() ? "" : ", ") + k;
  return out;
}

}  // namespace

void check_state_entry(std::string_view what, int64_t index, const std::string& key,
                       const Tensor& value, const Tensor& param) {
  LOCKSTEP_CHECK(value.defined(), "{}: state \"{}\" of parameter {} is undefined", what, key,
                 index);
  if (key == "step") {
    // A count the update reads as one number.
    LOCKSTEP_CHECK(value.dim() == 0,
                   "{}: state \"step\" of parameter {} has shape {}; a step count is a 0-dim "
                   "tensor",
                   what, index, runtime::shape_str(value.shape()));
    // The update computes 1 - beta^(step + 1): a count of -1 makes it 0 and
    // every parameter NaN, a fractional or non-finite one is no count at all.
    const double count = value.item();
    LOCKSTEP_CHECK(count >= 0 && std::isfinite(count) && count == std::floor(count),
                   "{}: state \"step\" of parameter {} is {}; a count of steps taken is a "
                   "whole number >= 0 (the state is damaged: load one saved by state_dict())",
                   what, index, count);
    return;
  }
  // Per-element state (momentum buffers, moments) must match the parameter,
  // which the update reads and writes element by element; a 0-dim entry only
  // for a 0-dim parameter.
  LOCKSTEP_CHECK(value.shape() == param.shape(),
                 "{}: state \"{}\" of parameter {} has shape {}, the parameter has shape {}", what,
                 key, index, runtime::shape_str(value.shape()), runtime::shape_str(param.shape()));
  LOCKSTEP_CHECK(runtime::is_floating(value.dtype()),
                 "{}: state \"{}\" of parameter {} has dtype {}; per-element optimizer state is "
                 "floating-point (it is loaded in the parameter's dtype, {})",
                 what, key, index, runtime::dtype_name(value.dtype()),
                 runtime::dtype_name(param.dtype()));
}

void Optimizer::check_state_keys(std::string_view, int64_t,
                                 const std::map<std::string, Tensor>&) const {}

namespace detail {

void check_state_keys(std::string_view what, std::string_view optimizer, int64_t index,
                      const std::map<std::string, Tensor>& entries,
                      std::initializer_list<const char*> kept,
                      std::initializer_list<const char*> together) {
  const auto quoted = [](std::initializer_list<const char*> keys) {
    std::string out;
    for (const char* k : keys) out += fmt::format("{}\"{}\"", out.empty() ? "" : ", ", k);
    return out;
  };
  for (const auto& [key, value] : entries) {
    bool known = false;
    for (const char* k : kept) known = known || key == k;
    LOCKSTEP_CHECK(known,
                   "{}: state \"{}\" of parameter {} is not {} state ({} keeps {}); the state is "
                   "from another kind of optimizer: load it into the kind that saved it",
                   what, key, index, optimizer, optimizer, quoted(kept));
  }
  if (entries.empty()) return;  // a parameter not yet stepped
  for (const char* k : together) {
    LOCKSTEP_CHECK(entries.contains(k),
                   "{}: the state of parameter {} has no \"{}\"; {} keeps {} together (a "
                   "parameter not yet stepped has none of them), so the state is incomplete: "
                   "load a whole state_dict()",
                   what, index, k, optimizer, quoted(together));
  }
}

void check_step_inputs(std::string_view optimizer, size_t group, size_t index, const Tensor& param,
                       const std::map<std::string, Tensor>* state,
                       std::initializer_list<const char*> keys) {
  const auto where = [&] { return fmt::format("parameter {} of group {}", index, group); };
  LOCKSTEP_CHECK(runtime::is_floating(param.dtype()),
                 "{}.step: {} has dtype {}; only floating-point tensors can be optimized",
                 optimizer, where(), runtime::dtype_name(param.dtype()));
  const Tensor grad = param.grad();
  LOCKSTEP_CHECK(grad.shape() == param.shape() && grad.device() == param.device(),
                 "{}.step: the gradient of {} has shape {} on {}, the parameter shape {} on {}",
                 optimizer, where(), runtime::shape_str(grad.shape()), grad.device().str(),
                 runtime::shape_str(param.shape()), param.device().str());
  for (int64_t d = 0; d < param.dim(); ++d) {
    LOCKSTEP_CHECK(param.strides()[d] != 0 || param.shape()[d] <= 1,
                   "{}.step: {} (shape {}, strides {}) has several elements at one memory "
                   "location (an expanded tensor); optimize a .clone() of it",
                   optimizer, where(), runtime::shape_str(param.shape()),
                   runtime::shape_str(param.strides()));
  }
  if (state == nullptr) return;
  for (const char* key : keys) {
    const auto it = state->find(key);
    if (it == state->end()) continue;
    const Tensor& value = it->second;
    if (std::string_view(key) == "step") {
      LOCKSTEP_CHECK(value.defined() && value.numel() == 1,
                     "{}.step: the state \"step\" of {} is not a single number", optimizer,
                     where());
      continue;
    }
    LOCKSTEP_CHECK(value.defined() && value.shape() == param.shape() &&
                       value.dtype() == param.dtype() && value.device() == param.device(),
                   "{}.step: the state \"{}\" of {} is {} {} on {}, the parameter {} {} on {}; "
                   "convert a model before making its optimizer (or load the optimizer's "
                   "state_dict() again, which converts the state to the parameters)",
                   optimizer, key, where(),
                   value.defined() ? runtime::dtype_name(value.dtype()) : "undefined",
                   value.defined() ? runtime::shape_str(value.shape()) : "",
                   value.defined() ? value.device().str() : "-", runtime::dtype_name(param.dtype()),
                   runtime::shape_str(param.shape()), param.device().str());
  }
}

}  // namespace detail

void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  ++*zero_grads_;
  for (auto& group : groups_) {
    for (auto& p : group.params) {
      if (set_to_none) {
        p.set_grad(Tensor{});
      } else if (p.grad().defined()) {
        // As PyTorch: the zeroed gradient is a plain tensor, not the output
        // of the computation it was set from (whose graph it would keep alive
        // and lead a use of it back into), nor a tensor requiring grad.
        Tensor g = p.grad();
        if (g.grad_fn()) {
          g = g.detach();
          p.set_grad(g);
        } else if (g.requires_grad()) {
          g.requires_grad_(false);
        }
        g.zero_();
      }
    }
  }
}

void Optimizer::add_param_group(ParamGroup group) {
  std::vector<ParamGroup> one;
  one.push_back(std::move(group));
  add_param_groups(std::move(one));
}

void Optimizer::add_param_groups(std::vector<ParamGroup> groups) {
  // The parameters already grouped are gathered once for all the new groups:
  // a constructor given one group per parameter (20,000 of them) would
  // otherwise gather them again for each group, quadratic in their number.
  std::unordered_set<const runtime::TensorImpl*> seen;
  for (const auto& g : groups_)
    for (const auto& p : g.params) seen.insert(p.impl_ptr());
  for (auto& group : groups) add_checked(std::move(group), seen);
}

void Optimizer::add_checked(ParamGroup group,
                            std::unordered_set<const runtime::TensorImpl*>& seen) {
  // A group of no parameters is kept, as PyTorch's add_param_group keeps it
  // (a model's optional part absent in this configuration): its index in
  // state_dict()'s groups stays that of the configuration that has it.
  for (size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    LOCKSTEP_CHECK(p.defined(), "{}: parameter {} of the new group is undefined", name_, i);
    LOCKSTEP_CHECK(runtime::is_floating(p.dtype()),
                   "{}: parameter {} of the new group has dtype {}; only floating-point tensors "
                   "can be optimized",
                   name_, i, runtime::dtype_name(p.dtype()));
    LOCKSTEP_CHECK(p.is_leaf(),
                   "{}: parameter {} of the new group is not a leaf tensor (it has a grad_fn); "
                   "optimize the leaf, or a detach()ed copy",
                   name_, i);
    LOCKSTEP_CHECK(seen.insert(p.impl_ptr()).second,
                   "{}: parameter {} of the new group appears more than once among the "
                   "optimizer's parameter groups",
                   name_, i);
  }
  GroupOptions options = defaults_;
  for (const auto& [key, value] : group.options) {
    LOCKSTEP_CHECK(defaults_.contains(key), "{}: unknown option \"{}\" (known: {})", name_, key,
                   key_list(defaults_));
    options[key] = value;
  }
  validate(options);
  group.options = std::move(options);
  groups_.push_back(std::move(group));
}

OptimizerState Optimizer::state_dict() const {
  OptimizerState out;
  int64_t index = 0;
  for (const auto& group : groups_) {
    OptimizerState::Group saved{group.options, {}};
    for (const auto& p : group.params) {
      auto it = state_.find(p.impl_ptr());
      if (it != state_.end() && !it->second.empty()) out.state[index] = it->second;
      saved.params.push_back(index++);
    }
    out.param_groups.push_back(std::move(saved));
  }
  return out;
}

void Optimizer::load_state_dict(const OptimizerState& saved) {
  LOCKSTEP_CHECK(saved.param_groups.size() == groups_.size(),
                 "{}.load_state_dict: the saved state has {} parameter group(s), this optimizer "
                 "has {}",
                 name_, saved.param_groups.size(), groups_.size());
  // Saved parameter number -> this optimizer's parameter, by position.
  std::map<int64_t, const Tensor*> param_of;
  std::vector<GroupOptions> options(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    const auto& sg = saved.param_groups[g];
    LOCKSTEP_CHECK(sg.params.size() == groups_[g].params.size(),
                   "{}.load_state_dict: saved parameter group {} has {} parameter(s), this "
                   "optimizer's has {}",
                   name_, g, sg.params.size(), groups_[g].params.size());
    for (size_t i = 0; i < sg.params.size(); ++i) param_of[sg.params[i]] = &groups_[g].params[i];
    options[g] = groups_[g].options;  // keys missing from the save keep their current value
    for (const auto& [key, value] : sg.options) {
      LOCKSTEP_CHECK(defaults_.contains(key),
                     "{}.load_state_dict: saved group {} has unknown option \"{}\" (known: {})",
                     name_, g, key, key_list(defaults_));
      options[g][key] = value;
    }
    validate(options[g]);
  }

  NoGradGuard no_grad;
  std::unordered_map<const runtime::TensorImpl*, std::map<std::string, Tensor>> state;
  for (const auto& [index, entries] : saved.state) {
    auto it = param_of.find(index);
    LOCKSTEP_CHECK(it != param_of.end(),
                   "{}.load_state_dict: the saved state is for parameter {}, which no saved "
                   "parameter group lists",
                   name_, index);
    const Tensor& p = *it->second;
    auto& dst = state[p.impl_ptr()];
    for (const auto& [key, value] : entries) {
      check_state_entry(fmt::format("{}.load_state_dict", name_), index, key, value, p);
      Tensor v = value.detach().to(p.device());
      // As PyTorch: every floating entry but the step count takes the
      // parameter's dtype, whatever its rank (a scalar parameter's buffers
      // are 0-dim too).
      if (key != "step" && v.dtype() != p.dtype()) v = v.to(p.dtype());
      dst[key] = v.clone();  // never alias the caller's tensors
    }
    check_state_keys(fmt::format("{}.load_state_dict", name_), index, entries);
  }
  for (size_t g = 0; g < groups_.size(); ++g) groups_[g].options = std::move(options[g]);
  state_ = std::move(state);
}

}  // namespace lockstep::optim
