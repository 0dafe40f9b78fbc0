#include "lockstep/train/run_settings.h"

#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "lockstep/runtime/checkpoint/metadata_text.h"
#include "lockstep/runtime/error.h"

namespace lockstep::train {

namespace {

constexpr std::string_view kFixedPrefix = "run.fixed.";
constexpr std::string_view kChangeablePrefix = "run.changeable.";
constexpr std::string_view kFixedEscapedPrefix = "run.fixed_escaped.";
constexpr std::string_view kChangeableEscapedPrefix = "run.changeable_escaped.";

void add(std::map<std::string, std::string>& out, const std::map<std::string, std::string>& values,
         std::string_view prefix, std::string_view escaped_prefix) {
  for (const auto& [name, value] : values) {
    LOCKSTEP_CHECK(runtime::is_utf8(name),
                   "run setting '{}': its name is not UTF-8 text, which checkpoint metadata "
                   "cannot hold; name it in UTF-8",
                   runtime::escape_bytes(name));
    if (runtime::is_utf8(value))
      out[std::string(prefix) + name] = value;
    else
      out[std::string(escaped_prefix) + name] = runtime::escape_bytes(value);
  }
}

// An escaped setting's value, unescaped (`key` names it in the error).
std::string unescaped(const std::string& key, const std::string& value) {
  auto bytes = runtime::unescape_bytes(value);
  LOCKSTEP_CHECK(bytes.has_value(),
                 "checkpoint metadata '{}' = \"{}\" is not escaped text (a backslash must be "
                 "followed by another or by x and two hex digits); the file was edited or is "
                 "corrupt",
                 key, value);
  return *bytes;
}

// A value as a message shows it: bytes that are not UTF-8 escaped.
std::string shown(const std::string& value) {
  return runtime::is_utf8(value) ? value : runtime::escape_bytes(value);
}

// What a changed data digest means, and the ways out.
std::string data_changed(const std::string& path, const std::string& was,
                         const std::string& is) {
  return fmt::format(
      "\nThe data under {} is not the data this run started with: digest {} then, {} now. "
      "The files changed after the run began (another version of the package or dataset, "
      "or of the program's filtering), so the run's sample order and place in the epoch no "
      "longer fit them. Start a new run in another checkpoint directory (or move this one's "
      "checkpoints aside), or put the run's original data back under {} to continue it.",
      path, was, is, path);
}

// The data path as compared: "/srv/data/", "/srv/data/." and "/srv/data"
// name one directory, so a resume that spells it another way is the same run.
std::string path_form(const std::string& path) {
  std::filesystem::path p = std::filesystem::path(path).lexically_normal();
  if (!p.has_filename() && p.has_relative_path()) p = p.parent_path();
  return p.string();
}

}  // namespace

std::map<std::string, std::string> run_settings_metadata(const RunSettings& settings) {
  std::map<std::string, std::string> out;
  add(out, settings.fixed, kFixedPrefix, kFixedEscapedPrefix);
  add(out, settings.changeable, kChangeablePrefix, kChangeableEscapedPrefix);
  return out;
}

std::optional<RunSettings> read_run_settings(const std::map<std::string, std::string>& metadata) {
  RunSettings settings;
  bool any = false;
  for (const auto& [key, value] : metadata) {
    if (key.starts_with(kFixedPrefix)) {
      settings.fixed[key.substr(kFixedPrefix.size())] = value;
    } else if (key.starts_with(kChangeablePrefix)) {
      settings.changeable[key.substr(kChangeablePrefix.size())] = value;
    } else if (key.starts_with(kFixedEscapedPrefix)) {
      settings.fixed[key.substr(kFixedEscapedPrefix.size())] = unescaped(key, value);
    } else if (key.starts_with(kChangeableEscapedPrefix)) {
      settings.changeable[key.substr(kChangeableEscapedPrefix.size())] = unescaped(key, value);
    } else {
      continue;
    }
    any = true;
  }
  if (!any) return std::nullopt;
  return settings;
}

std::vector<SettingChange> compare_run_settings(const RunSettings& saved, const RunSettings& now,
                                                const std::string& file) {
  std::vector<std::string> differences;
  auto value = [](const std::map<std::string, std::string>& m, const std::string& name) {
    auto it = m.find(name);
    return it == m.end() ? std::string("(not set)") : it->second;
  };
  std::set<std::string> names;
  for (const auto& [name, v] : saved.fixed) names.insert(name);
  for (const auto& [name, v] : now.fixed) names.insert(name);
  // A run saved before data digests were recorded cannot be checked.
  if (!saved.fixed.contains(kDataDigestSetting)) names.erase(kDataDigestSetting);
  // Where both record what was loaded and it is the same, the data's path is
  // only where it lies now (a run moved to another machine, its data with it):
  // another path is a change, not another run.
  const bool same_data = saved.fixed.contains(kDataDigestSetting) &&
                         now.fixed.contains(kDataDigestSetting) &&
                         saved.fixed.at(kDataDigestSetting) == now.fixed.at(kDataDigestSetting);
  std::vector<SettingChange> changes;
  for (const auto& name : names) {
    const std::string was = value(saved.fixed, name), is = value(now.fixed, name);
    const bool both = saved.fixed.contains(name) && now.fixed.contains(name);
    const bool same = name == kDataSetting && both ? path_form(was) == path_form(is) : was == is;
    if (!same && name == kDataSetting && both && same_data)
      changes.push_back({name, was, is});
    else if (!same)
      differences.push_back(fmt::format("  {}: saved {}, now {}", name, shown(was), shown(is)));
  }
  if (!differences.empty()) {
    std::string msg = fmt::format(
        "cannot resume from {}: the run was saved with other settings, and continuing it with "
        "these would compute something else:",
        file);
    for (const auto& d : differences) msg += "\n" + d;
    if (value(saved.fixed, kWorldSizeSetting) != value(now.fixed, kWorldSizeSetting))
      msg +=
          "\nA run continues on as many ranks as it was saved with: each rank's share of the "
          "data, its place in the epoch, its random generators and the global batch all depend "
          "on the number of ranks, so no other number continues it exactly.";
    const auto digest_was = saved.fixed.find(kDataDigestSetting);
    const auto digest_is = now.fixed.find(kDataDigestSetting);
    const bool digest_differs = digest_was != saved.fixed.end() &&
                                digest_is != now.fixed.end() &&
                                digest_was->second != digest_is->second;
    if (digest_differs && differences.size() == 1) {
      msg += data_changed(now.fixed.contains(kDataSetting) ? shown(now.fixed.at(kDataSetting))
                                                           : std::string("the run's data path"),
                          digest_was->second, digest_is->second);
    } else {
      msg +=
          "\nResume with the settings the run was saved with, or start a new run in another "
          "checkpoint directory.";
      // What is loaded follows the other settings (a path, a number of
      // samples): the files themselves may well be the same.
      if (digest_differs)
        msg +=
            " The data digest may differ only because those settings load other data; if it "
            "still differs with them as saved, the files changed since the run began.";
    }
    throw Error(msg);
  }
  for (const auto& [name, is] : now.changeable) {
    auto it = saved.changeable.find(name);
    if (it == saved.changeable.end()) {
      changes.push_back({name, "(not set)", is});
    } else if (it->second != is) {
      changes.push_back({name, it->second, is});
    }
  }
  return changes;
}

std::string schedule_setting(const optim::LRScheduler* scheduler) {
  if (scheduler == nullptr) return "none";
  std::string text = scheduler->name() + "(";
  bool first = true;
  for (const auto& [name, value] : scheduler->options()) {
    text += fmt::format("{}{}={}", first ? "" : ", ", name, value);
    first = false;
  }
  return text + ")";
}

}  // namespace lockstep::train
