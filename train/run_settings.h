// The settings that shape a training run, kept in each of its checkpoints so
// that a resume can be checked against them.
//
//   RunSettings now{.fixed = {{"model", "cnn"}, {"batch_size", "64"}},
//                   .changeable = {{"lr", "0.05"}, {"epochs", "3"}}};
//   auto changes = compare_run_settings(saved, now, file);  // throws on a fixed difference
//   for (auto& c : changes) print("{} {} replaces the saved {}", c.name, c.now, c.saved);
//
// Fixed settings decide what the run computes (world size, batch size, data,
// model, optimizer, schedule): a resume with any of them different would be
// another run, so it is refused. Changeable settings (learning rate, epochs,
// logging) may differ on resume; the differences come back to be applied and
// printed. Values are text, compared exactly: format numbers the same way
// every time (fmt's "{}" gives the shortest text that reads back exactly).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/optim/lr_scheduler.h"

namespace lockstep::train {

// Set by open_training_run (training_run.h) from the process group.
inline constexpr const char* kWorldSizeSetting = "world_size";
// Set by record_run_settings from the directory's retention (changeable): a
// resume that does not choose it keeps the run's (TrainingRunOptions).
inline constexpr const char* kKeepLastSetting = "keep_last";
// The data's path as given (compared as a path: "/srv/data/" is "/srv/data"),
// and a digest of what was loaded from it
// (data_digest.h): a resume on other files under the same path is refused,
// naming both digests, and one on the same files under another path (the
// run and its data moved) resumes, the path returned as a change. A
// checkpoint that records no digest (saved by an earlier version) still
// resumes: the digest is recorded from then on.
inline constexpr const char* kDataSetting = "data";
inline constexpr const char* kDataDigestSetting = "data_digest";

struct RunSettings {
  std::map<std::string, std::string> fixed;       // a resume must keep these
  std::map<std::string, std::string> changeable;  // a resume may change these

  bool operator==(const RunSettings&) const = default;
};

// A setting whose value on resume differs from the saved one: a changeable
// one, or the data's path where the data is the same (kDataSetting).
struct SettingChange {
  std::string name;
  std::string saved;
  std::string now;
};

// As checkpoint metadata: "run.fixed.<name>" and "run.changeable.<name>".
// A value that is not UTF-8 text (a path holding a Latin-1 byte is a legal
// Linux path), which a safetensors header cannot hold as it is, goes under
// "run.fixed_escaped.<name>" (or "run.changeable_escaped.<name>") as
// runtime::escape_bytes() writes it, and reads back byte for byte. Throws
// naming a setting whose name is not UTF-8.
std::map<std::string, std::string> run_settings_metadata(const RunSettings& settings);
// Back from a checkpoint's metadata; nullopt when it records none (a file
// saved before runs recorded their settings). Throws naming the key of an
// escaped value that does not unescape.
std::optional<RunSettings> read_run_settings(const std::map<std::string, std::string>& metadata);

// Throws one lockstep::Error naming `file` and every fixed setting that
// differs between `saved` and `now` (one missing on either side included,
// but for a data digest that `saved` lacks), with what to do. Otherwise
// returns the changeable settings whose values differ, by name (and the
// data's path, where the digests on both sides agree); a changeable setting
// `now` lacks keeps its saved value and is no change.
std::vector<SettingChange> compare_run_settings(const RunSettings& saved, const RunSettings& now,
                                                const std::string& file);

// A schedule as a fixed setting: its type and every setting, e.g.
// "CosineLR(eta_min=0, t_max=640)"; "none" for no scheduler. A schedule whose
// length follows the number of epochs shows it here.
std::string schedule_setting(const optim::LRScheduler* scheduler);

}  // namespace lockstep::train
