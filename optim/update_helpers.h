// What the optimizers' update code shares: a runtime flag made a compile-time
// one (so each variant of an update loop is branch-free), reading an option
// from a parameter group, and the check of a parameter before a step.
#pragma once

#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>

#include "lockstep/optim/optimizer.h"
#include "lockstep/runtime/error.h"

namespace lockstep::optim::detail {

// Calls fn(std::true_type) or fn(std::false_type).
template <class Fn>
void with_flag(bool on, Fn&& fn) {
  if (on)
    fn(std::true_type{});
  else
    fn(std::false_type{});
}

// options[key]; an error naming the optimizer when the group lacks it.
inline double group_option(const GroupOptions& options, const char* key, std::string_view optimizer) {
  auto it = options.find(key);
  LOCKSTEP_CHECK(it != options.end(), "{}: parameter group has no \"{}\" option", optimizer, key);
  return it->second;
}

// state[key], or null when `state` is null or lacks it.
inline const Tensor* find_entry(const std::map<std::string, Tensor>* state, const char* key) {
  if (state == nullptr) return nullptr;
  const auto it = state->find(key);
  return it == state->end() ? nullptr : &it->second;
}

// Throws naming `optimizer` unless its step can update `param` (parameter
// `index` of group `group`, with a gradient) without failing part way: a
// floating dtype, a gradient of its shape, dtype and device, a memory
// location of its own for each element, and each of `keys` present in its
// `state` (may be null) as the update reads it: "step" one number, any other
// key of the parameter's shape, dtype and device (a Module::to after some
// steps converts the parameter, not the optimizer's state of it). The step
// checks every parameter with it before it changes anything.
void check_step_inputs(std::string_view optimizer, size_t group, size_t index, const Tensor& param,
                       const std::map<std::string, Tensor>* state,
                       std::initializer_list<const char*> keys);

// Optimizer::check_state_keys for an optimizer named `optimizer` that keeps
// the keys `kept` in a parameter's state, of which it reads `together` at
// every step (so a stepped parameter has them all).
void check_state_keys(std::string_view what, std::string_view optimizer, int64_t index,
                      const std::map<std::string, Tensor>& entries,
                      std::initializer_list<const char*> kept,
                      std::initializer_list<const char*> together);

}  // namespace lockstep::optim::detail
