// runtime/env: the one way the library reads the process environment
// (injectable, so tests need no setenv), the readers every variable goes
// through, and the variables the runtime itself reads: LOCKSTEP_HOST_CACHE_MB
// (cpu/host_cache.h) and LOCKSTEP_HEARTBEAT_FD/_MS (liveness.h). What a
// launcher tells a process (rank, world size, the store's address) is read
// by distributed/launch_env.h.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace lockstep::runtime {

// Looks a variable up; nullopt when unset. Injected so tests need no setenv.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// Reads the real process environment.
EnvLookup process_env();

// `text` as an error message shows a value it read: in single quotes, with
// control characters escaped ('29500\r'), and a carriage return explained:
// unescaped, it would hide the start of the message on a terminal, and it
// comes from a job script saved with Windows line endings.
std::string quoted_value(std::string_view text);
// Just the escaping: for a value inside other text ("host\r:29500").
std::string escape_controls(std::string_view text);

// A whole decimal number >= `minimum`; nullopt when unset. Throws naming the
// variable when it is anything else.
std::optional<int> read_whole_number(const EnvLookup& env, const char* name, int minimum);

// A positive number of seconds, up to a year (anything longer is a typo);
// nullopt when unset. Throws naming the variable, saying it is not `what`,
// with `example` as a value to set.
std::optional<std::chrono::milliseconds> read_seconds(const EnvLookup& env, const char* name,
                                                      const char* what, int example);

// A switch: false when unset, empty or 0, true when 1. Throws naming the
// variable for anything else, saying that 1 would `what_1_does`.
bool read_switch(const EnvLookup& env, const char* name, const char* what_1_does);

// LOCKSTEP_HOST_CACHE_MB, the bound on cached CPU blocks (cpu/host_cache.h);
// nullopt when unset. Throws naming the variable when it is not a whole
// number >= 0.
std::optional<int> read_host_cache_mb(const EnvLookup& env = process_env());

// LOCKSTEP_HEARTBEAT_FD (-1 when unset) and LOCKSTEP_HEARTBEAT_MS (1000 when
// unset): where and how often a rank tells lockstep-run it is alive
// (runtime/liveness.h). Throws naming the variable when malformed.
struct HeartbeatEnv {
  int fd = -1;
  std::chrono::milliseconds interval{1000};
};
HeartbeatEnv read_heartbeat_env(const EnvLookup& env = process_env());

}  // namespace lockstep::runtime
