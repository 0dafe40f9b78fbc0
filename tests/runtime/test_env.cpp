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

TEST_CASE("a value in an error shows its control characters escaped, a carriage return explained") {
  using lockstep::runtime::quoted_value;
  CHECK(quoted_value("gloo") == "'gloo'");
  CHECK(quoted_value("a\tb\x01\x7f") == "'a\\tb\\x01\\x7f'");
  // A job script saved with Windows line endings exports "29500\r": printed
  // as it is, the \r sent the terminal's cursor back over the variable's name.
  std::string message;
  try {
    lockstep::runtime::read_whole_number(env_of({{"MASTER_PORT", "29500\r"}}), "MASTER_PORT", 1);
  } catch (const lockstep::Error& e) {
    message = e.what();
  }
  CHECK(message.find('\r') == std::string::npos);
  CHECK_THAT(message, Catch::Matchers::StartsWith("MASTER_PORT='29500\\r' (a carriage return: was "
                                                  "it set by a script with Windows line endings?) "
                                                  "is not a whole number"));
}
