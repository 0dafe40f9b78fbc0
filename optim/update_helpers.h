// What the optimizers' update code shares: a runtime flag made a compile-time
// one (so each variant of an update loop is branch-free), and reading an
// option from a parameter group.
#pragma once

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

}  // namespace lockstep::optim::detail
