// An EnvLookup (runtime/env.h) that reads a fixed set of variables instead of
// the process environment: what a rank would see under a given launcher.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>

#include "lockstep/runtime/env.h"

namespace lockstep::testing {

inline runtime::EnvLookup env_lookup(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace lockstep::testing
