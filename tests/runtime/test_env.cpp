// The environment readers every variable goes through (runtime/env.h), on an
// injected environment.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "lockstep/runtime/env.h"
#include "lockstep/runtime/error.h"

using lockstep::runtime::EnvLookup;
using lockstep::runtime::read_switch;

namespace {
EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional(it->second);
  };
}
}  // namespace

TEST_CASE("a switch is off unless set to 1, and anything but 0 or 1 is refused by name") {
  CHECK_FALSE(read_switch(env_of({}), "LOCKSTEP_X", "do x"));
  CHECK_FALSE(read_switch(env_of({{"LOCKSTEP_X", ""}}), "LOCKSTEP_X", "do x"));
  CHECK_FALSE(read_switch(env_of({{"LOCKSTEP_X", "0"}}), "LOCKSTEP_X", "do x"));
  CHECK(read_switch(env_of({{"LOCKSTEP_X", "1"}}), "LOCKSTEP_X", "do x"));
  for (const char* bad : {"yes", "true", "2", " 1", "on"}) {
    INFO(bad);
    CHECK_THROWS_WITH(read_switch(env_of({{"LOCKSTEP_X", bad}}), "LOCKSTEP_X", "do x"),
                      Catch::Matchers::Contains("LOCKSTEP_X='" + std::string(bad) +
                                                "' is neither 0 nor 1; set it to 1 to do x"));
  }
}
