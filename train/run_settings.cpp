#include "lockstep/train/run_settings.h"

#include <set>

#include <fmt/format.h>

#include "lockstep/runtime/error.h"

namespace lockstep::train {

namespace {

constexpr std::string_view kFixedPrefix = "run.fixed.";
constexpr std::string_view kChangeablePrefix = "run.changeable.";

}  // namespace

std::map<std::string, std::string> run_settings_metadata(const RunSettings& settings) {
  std::map<std::string, std::string> out;
  for (const auto& [name, value] : settings.fixed) out[std::string(kFixedPrefix) + name] = value;
  for (const auto& [name, value] : settings.changeable)
    out[std::string(kChangeablePrefix) + name] = value;
  return out;
}

std::optional<RunSettings> read_run_settings(const std::map<std::string, std::string>& metadata) {
  RunSettings settings;
  bool any = false;
  for (const auto& [key, value] : metadata) {
    if (key.starts_with(kFixedPrefix)) {
      settings.fixed[key.substr(kFixedPrefix.size())] = value;
      any = true;
    } else if (key.starts_with(kChangeablePrefix)) {
      settings.changeable[key.substr(kChangeablePrefix.size())] = value;
      any = true;
    }
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
  for (const auto& name : names) {
    const std::string was = value(saved.fixed, name), is = value(now.fixed, name);
    if (was != is) differences.push_back(fmt::format("  {}: saved {}, now {}", name, was, is));
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
    msg +=
        "\nResume with the settings the run was saved with, or start a new run in another "
        "checkpoint directory.";
    throw Error(msg);
  }
  std::vector<SettingChange> changes;
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
