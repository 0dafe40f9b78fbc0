// A directory of numbered checkpoints with retention: keep the last K steps
// plus the best one by a metric.
//
//   CheckpointDir dir("runs/a/ckpt", {.keep_last = 3, .best = BestMode::min});
//   dir.save(content, step, val_loss);       // rank 0 only
//   if (auto last = dir.load_latest()) { resume from last->content ... }
//
// Files are "<prefix>-<step, 10 digits>.safetensors", each written atomically
// (atomic_file.h), with the step and metric in its metadata
// ("lockstep.step", "lockstep.metric"). All state is in the directory itself,
// so a restarted process, after a crash included, sees what the last one left:
// the file names give the steps, the headers the metrics. Temporary files of
// killed writers are never listed and are removed when a CheckpointDir opens.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/runtime/checkpoint/checkpoint.h"

namespace lockstep::runtime {

enum class BestMode { none, min, max };  // min: e.g. a loss; max: e.g. an accuracy
enum class OnCorrupt { skip_with_warning, throw_error };

inline constexpr const char* kStepKey = "lockstep.step";
inline constexpr const char* kMetricKey = "lockstep.metric";

struct CheckpointDirOptions {
  std::string prefix = "ckpt";
  int keep_last = 3;               // the newest K steps survive each save (K >= 1)
  BestMode best = BestMode::none;  // with min or max, the best metric survives too
  // What latest() and load_latest() do with a newest file that does not load.
  OnCorrupt on_corrupt = OnCorrupt::skip_with_warning;
  // Where warnings go; empty: standard error.
  std::function<void(const std::string&)> warn;
};

struct CheckpointEntry {
  std::filesystem::path path;
  int64_t step = 0;
  std::optional<double> metric;  // absent when saved without one, or unreadable
};

struct LoadedCheckpoint {
  CheckpointEntry entry;
  CheckpointContent content;
};

class CheckpointDir {
 public:
  // Creates the directory if needed and removes stale temporary files.
  explicit CheckpointDir(std::filesystem::path dir, CheckpointDirOptions options = {});

  // Writes `content` as checkpoint `step` (replacing one of the same step),
  // then deletes the files retention no longer keeps. A NaN metric is stored
  // but never counts as best.
  CheckpointEntry save(const CheckpointContent& content, int64_t step,
                       std::optional<double> metric = std::nullopt, const SaveOptions& save = {});

  // The checkpoints present, by increasing step. Reads each header (cheap)
  // for its metric; verifies no data.
  std::vector<CheckpointEntry> list() const;
  // The best checkpoint by metric (BestMode::none: nullopt); not verified.
  std::optional<CheckpointEntry> best() const;
  // The newest checkpoint that loads and verifies (this reads it whole); a
  // corrupt newer one is skipped with a warning naming it, or thrown, per
  // options.on_corrupt. nullopt when there is none.
  std::optional<CheckpointEntry> latest() const;
  // latest(), loaded.
  std::optional<LoadedCheckpoint> load_latest(const LoadOptions& load = {}) const;

  const std::filesystem::path& path() const { return dir_; }
  std::filesystem::path path_for_step(int64_t step) const;

 private:
  std::optional<int64_t> step_of(const std::string& file_name) const;
  bool better(double a, double b) const;  // a strictly better than b
  void warn(const std::string& message) const;

  std::filesystem::path dir_;
  CheckpointDirOptions options_;
};

}  // namespace lockstep::runtime
