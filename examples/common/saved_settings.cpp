#include "saved_settings.h"

#include <charconv>
#include <cstdint>
#include <type_traits>

#include "lockstep/runtime/error.h"

namespace examples {

using namespace lockstep;

namespace {

std::string flag(std::string option) {
  for (char& c : option) c = c == '_' ? '-' : c;
  return option;
}

}  // namespace

SavedSettings::Parts SavedSettings::parts(const std::string& text) {
  // "head k=v k=v" or "Head(k=v, k=v)".
  Parts out;
  const auto open = text.find('(');
  const bool call = open != std::string::npos && text.ends_with(")");
  const auto head_end = call ? open : std::min(text.find(' '), text.size());
  out.head = text.substr(0, head_end);
  std::string rest = call ? text.substr(open + 1, text.size() - open - 2) : text.substr(head_end);
  for (char& c : rest) c = c == ',' ? ' ' : c;
  size_t at = 0;
  while ((at = rest.find_first_not_of(' ', at)) != std::string::npos) {
    const auto end = std::min(rest.find(' ', at), rest.size());
    const std::string item = rest.substr(at, end - at);
    const auto eq = item.find('=');
    if (eq != std::string::npos) out.values[item.substr(0, eq)] = item.substr(eq + 1);
    at = end;
  }
  return out;
}

std::optional<std::string> SavedSettings::text(const std::string& option,
                                               const std::string& setting,
                                               const std::optional<std::string>& part) const {
  if (given_.contains(option)) return std::nullopt;
  auto it = saved_.fixed.find(setting);
  if (it == saved_.fixed.end()) {
    it = saved_.changeable.find(setting);
    if (it == saved_.changeable.end()) return std::nullopt;
  }
  if (!part) return it->second;
  const Parts p = parts(it->second);
  if (part->empty()) return p.head;
  const auto value = p.values.find(*part);
  if (value == p.values.end()) return std::nullopt;
  return value->second;
}

template <class T>
T SavedSettings::parse(const std::string& option, const std::string& setting,
                       const std::string& text) {
  if constexpr (std::is_same_v<T, std::string>) {
    return text;
  } else if constexpr (std::is_same_v<T, bool>) {
    LOCKSTEP_CHECK(text == "on" || text == "off",
                   "the checkpoint records {} as \"{}\", not on or off; give --{} (or leave it "
                   "out for off) on the command line",
                   setting, text, flag(option));
    return text == "on";
  } else {
    T value{};
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    LOCKSTEP_CHECK(ec == std::errc{} && end == text.data() + text.size(),
                   "the checkpoint records {} as \"{}\", where --{} needs a number; give --{} on "
                   "the command line",
                   setting, text, flag(option), flag(option));
    return value;
  }
}

// The types the examples' options have.
using Text = const std::string&;
template std::string SavedSettings::parse<std::string>(Text, Text, Text);
template bool SavedSettings::parse<bool>(Text, Text, Text);
template int SavedSettings::parse<int>(Text, Text, Text);
template int64_t SavedSettings::parse<int64_t>(Text, Text, Text);
template uint64_t SavedSettings::parse<uint64_t>(Text, Text, Text);
template double SavedSettings::parse<double>(Text, Text, Text);

}  // namespace examples
