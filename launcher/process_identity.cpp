#include "launcher/process_identity.h"

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace lockstep::launcher {

std::optional<uint64_t> process_start_time(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(in, text)) return std::nullopt;
  // The command name (field 2) may hold spaces and parentheses: count from
  // the last ')', which field 3 follows.
  const auto paren = text.rfind(')');
  if (paren == std::string::npos) return std::nullopt;
  size_t at = paren + 1;
  for (int field = 3; field <= 22; ++field) {
    at = text.find_first_not_of(' ', at);
    if (at == std::string::npos) return std::nullopt;
    if (field == 22) {
      uint64_t ticks = 0;
      const auto [end, ec] = std::from_chars(text.data() + at, text.data() + text.size(), ticks);
      return ec == std::errc() ? std::optional(ticks) : std::nullopt;
    }
    at = text.find(' ', at);
  }
  return std::nullopt;
}

bool process_stopped(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(in, text)) return false;
  // Field 3, the state, follows the command name's last ')'.
  const auto paren = text.rfind(')');
  const auto at = paren == std::string::npos ? paren : text.find_first_not_of(' ', paren + 1);
  return at != std::string::npos && (text[at] == 'T' || text[at] == 't');
}

bool group_has_living(pid_t pgid) {
  std::error_code error;
  // increment(error), not ++: a failed read says so instead of throwing.
  for (std::filesystem::directory_iterator it("/proc", error), end; !error && it != end;
       it.increment(error)) {
    const auto& entry = *it;
    const std::string name = entry.path().filename().string();
    if (name.empty() || name[0] < '0' || name[0] > '9') continue;
    std::ifstream in(entry.path() / "stat");
    std::string text;
    if (!std::getline(in, text)) continue;  // gone meanwhile
    // After the command name's last ')': state (field 3), ppid, pgrp (5).
    const auto paren = text.rfind(')');
    if (paren == std::string::npos || paren + 2 >= text.size()) continue;
    const char state = text[paren + 2];
    long ppid = 0, pgrp = 0;
    if (std::sscanf(text.c_str() + paren + 3, " %ld %ld", &ppid, &pgrp) != 2) continue;
    if (pgrp == pgid && state != 'Z' && state != 'X') return true;
  }
  // Unreadable /proc: say yes, so the group is waited for as before.
  return static_cast<bool>(error);
}

bool process_alive(pid_t pid, uint64_t start_time) {
  const auto now = process_start_time(pid);
  return now && *now == start_time;
}

}  // namespace lockstep::launcher
