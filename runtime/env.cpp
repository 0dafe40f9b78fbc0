#include "lockstep/runtime/env.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "lockstep/runtime/error.h"

namespace lockstep::runtime {

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

std::string escape_controls(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\r') {
      out += "\\r";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (byte < 0x20 || byte == 0x7f) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += c;
    }
  }
  return out;
}

std::string quoted_value(std::string_view text) {
  // Formatted, not "'" + ... + "'": GCC 12 warns (-Wrestrict) on that
  // concatenation, a false positive that fails a -Werror build.
  std::string out = fmt::format("'{}'", escape_controls(text));
  if (text.find('\r') != std::string_view::npos)
    out += " (a carriage return: was it set by a script with Windows line endings?)";
  return out;
}

namespace {

// A whole decimal integer >= minimum; throws naming the variable otherwise.
int parse_int(const std::string& name, const std::string& text, int minimum) {
  int value = 0;
  const char* first = text.data();
  const char* last = first + text.size();
  const auto [end, ec] = std::from_chars(first, last, value);
  // No example value: 0 is no port, nor a world size.
  LOCKSTEP_CHECK(!text.empty() && ec == std::errc() && end == last,
                 "{}={} is not a whole number; set it to a decimal integer of at least {} "
                 "or unset it",
                 name, quoted_value(text), minimum);
  LOCKSTEP_CHECK(value >= minimum, "{}={} is out of range; it must be at least {}", name, value,
                 minimum);
  return value;
}

}  // namespace

std::optional<int> read_whole_number(const EnvLookup& env, const char* name, int minimum) {
  if (name[0] == '\0') return std::nullopt;
  const auto text = env(name);
  if (!text) return std::nullopt;
  return parse_int(name, *text, minimum);
}

bool read_switch(const EnvLookup& env, const char* name, const char* what_1_does) {
  const auto text = env(name);
  if (!text || text->empty() || *text == "0") return false;
  LOCKSTEP_CHECK(*text == "1", "{}={} is neither 0 nor 1; set it to 1 to {}, or unset it", name,
                 quoted_value(*text), what_1_does);
  return true;
}

// Up to a year: it keeps the milliseconds in range.
std::optional<std::chrono::milliseconds> read_seconds(const EnvLookup& env, const char* name,
                                                      const char* what, int example) {
  const auto text = env(name);
  if (!text) return std::nullopt;
  double seconds = 0;
  const char* first = text->data();
  const char* last = first + text->size();
  const auto [end, ec] = std::from_chars(first, last, seconds);
  const bool number = !text->empty() && ec == std::errc() && end == last && std::isfinite(seconds);
  LOCKSTEP_CHECK(number && seconds > 0,
                 "{}={} is not {}; set it to a positive number of seconds (e.g. {}={}) or "
                 "unset it for the default",
                 name, quoted_value(*text), what, name, example);
  // The longest wait a process group keeps (ProcessGroup::kLongestTimeout).
  constexpr double kYear = 365.0 * 24 * 3600;
  LOCKSTEP_CHECK(seconds <= kYear,
                 "{}={} is more than a year ({:.0f} seconds), the most lockstep takes; set a "
                 "shorter time, or unset it for the default",
                 name, quoted_value(*text), kYear);
  return std::chrono::milliseconds(
      std::max<int64_t>(1, static_cast<int64_t>(std::llround(seconds * 1000.0))));
}

std::optional<int> read_host_cache_mb(const EnvLookup& env) {
  return read_whole_number(env, "LOCKSTEP_HOST_CACHE_MB", 0);
}

HeartbeatEnv read_heartbeat_env(const EnvLookup& env) {
  HeartbeatEnv h;
  h.fd = read_whole_number(env, "LOCKSTEP_HEARTBEAT_FD", 0).value_or(-1);
  h.interval = std::chrono::milliseconds(
      read_whole_number(env, "LOCKSTEP_HEARTBEAT_MS", 1).value_or(1000));
  return h;
}

}  // namespace lockstep::runtime
