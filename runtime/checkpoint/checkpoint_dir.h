// A directory of numbered checkpoints of one run, with retention: keep the
// run's last K steps plus its best one by a metric.
//
//   CheckpointDir dir("runs/a/ckpt", {.keep_last = 3, .best = BestMode::min});
//   dir.save(content, step, val_loss);       // rank 0 only
//   if (auto last = dir.load_latest()) { resume from last->content ... }
//
// Files are "<prefix>-<step, 10 digits>.safetensors" (no other name is one of
// the directory's: "ckpt-300.safetensors" is left alone), each written atomically
// (atomic_file.h), with the step, the metric, the run and the job that saved
// it in its metadata ("lockstep.step", "lockstep.metric", "lockstep.run",
// "lockstep.job"). All state is in the
// directory itself, so a restarted process, after a crash included, sees what
// the last one left: the file names give the steps, the headers the metrics
// and runs. Temporary files of killed writers are never listed and are
// removed when a CheckpointDir opens and at each save.
//
// Runs: every save belongs to the run set with set_run(); without one, a new
// random run id is made at the first save. A program that resumes a run sets
// that run's id (and its CheckpointRun::metadata) before saving again.
// Retention only ever deletes files of the current run, and never its newest
// save: files of other runs, files saved without a run id, files whose header
// does not read, and the run's own files of higher steps than the newest save
// (left by a run that resumed from an earlier step) all stay. Nor does a save
// replace any of them: a save whose step has a file that is not the current
// run's throws, naming it, and writes nothing. Starting and resuming runs
// across ranks: train/training_run.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/runtime/checkpoint/checkpoint.h"

namespace lockstep::runtime {

enum class BestMode { none, min, max };  // min: e.g. a loss; max: e.g. an accuracy
enum class OnCorrupt { skip_with_warning, throw_error };

inline constexpr const char* kStepKey = "lockstep.step";
inline constexpr const char* kMetricKey = "lockstep.metric";
inline constexpr const char* kRunKey = "lockstep.run";
inline constexpr const char* kJobKey = "lockstep.job";

struct CheckpointDirOptions {
  std::string prefix = "ckpt";
  int keep_last = 3;               // the run's newest K steps survive each save (K >= 1)
  BestMode best = BestMode::none;  // with min or max, the run's best metric survives too
  // What latest() and load_latest() do with a newest file that does not load.
  OnCorrupt on_corrupt = OnCorrupt::skip_with_warning;
  // Where warnings go; empty: standard error.
  std::function<void(const std::string&)> warn;
  // true: only for reading (e.g. ranks that never save): the directory is
  // neither created nor checked nor cleaned, and save() and set_aside() throw.
  bool read_only = false;
};

// The run that saves go to.
struct CheckpointRun {
  std::string id;  // empty: a new one is made at the first save
  // The job that saves (lockstep-run's LOCKSTEP_JOB_ID: one launch, restarts
  // included), recorded in each save so that a restarted attempt finds the
  // run its job was saving (train/training_run.h); empty: none recorded.
  std::string job;
  // Written into every save of the run (e.g. the settings that shape it);
  // keys must not start with "lockstep.", and keys and values must be UTF-8
  // (safetensors headers are JSON; runtime::escape_bytes keeps bytes whole).
  std::map<std::string, std::string> metadata;
};

struct CheckpointEntry {
  std::filesystem::path path;
  int64_t step = 0;
  std::optional<double> metric;  // absent when saved without one, or unreadable
  // The run that saved it; absent when saved before runs had ids, or unreadable.
  std::optional<std::string> run_id;
  // The job that saved it (CheckpointRun::job); absent when none was recorded.
  std::optional<std::string> job_id;
  std::string unreadable;  // why the header does not read; empty when it does
};

struct LoadedCheckpoint {
  CheckpointEntry entry;
  CheckpointContent content;
};

// A fresh random run id: 16 hex digits.
std::string new_run_id();

class CheckpointDir {
 public:
  // Unless options.read_only: creates the directory if needed, checks that
  // files can be created in it (throwing, with the system's reason, if not)
  // and removes stale temporary files.
  explicit CheckpointDir(std::filesystem::path dir, CheckpointDirOptions options = {});

  // Writes `content` as checkpoint `step` of the current run (replacing the
  // run's own file of that step), then deletes the run's files that retention
  // no longer keeps. A NaN metric is stored but never counts as best. Throws,
  // writing nothing, when the step's file is not the current run's: another
  // run's, one saved without a run id, or one whose header does not read. A
  // write that fails (a full disk) throws too, the directory's checkpoints
  // left as they were, saying what to do where it ran out of room.
  // The step, metric, run and job keys of `content`'s metadata are replaced.
  CheckpointEntry save(const CheckpointContent& content, int64_t step,
                       std::optional<double> metric = std::nullopt, const SaveOptions& save = {});

  // The run later saves belong to; its id may be empty (one is made then).
  // Throws when run.metadata breaks CheckpointRun's rules, naming the key.
  void set_run(CheckpointRun run);
  const CheckpointRun& run() const { return run_; }

  // How many of the run's newest steps each later save keeps (>= 1, or throws).
  void set_keep_last(int keep_last);
  int keep_last() const { return options_.keep_last; }

  // The checkpoints present, of every run, by increasing step. Reads each
  // header (cheap) for its metric and run; verifies no data.
  std::vector<CheckpointEntry> list() const;
  // One checkpoint file, described as list() does.
  CheckpointEntry entry_for(const std::filesystem::path& file) const;
  // The best checkpoint by metric (BestMode::none: nullopt); not verified.
  // Of the current run once it has an id, else of the whole directory.
  std::optional<CheckpointEntry> best() const;
  // The newest checkpoint (of any run) that loads and verifies (this reads
  // it whole); a corrupt newer one is skipped with a warning naming it, or
  // thrown, per options.on_corrupt. nullopt when there is none. A file that
  // is deleted between listing and opening it (a running job's retention,
  // seen by a reader beside it) is neither: the directory is listed again.
  std::optional<CheckpointEntry> latest() const;
  // latest(), loaded.
  std::optional<LoadedCheckpoint> load_latest(const LoadOptions& load = {}) const;

  // Moves every checkpoint file (of any run, damaged ones included) into a
  // new subdirectory "<prefix>-set-aside-<UTC date and time>" and returns its
  // path; deletes nothing. Empty when there was nothing to move.
  std::filesystem::path set_aside();

  const std::filesystem::path& path() const { return dir_; }
  std::filesystem::path path_for_step(int64_t step) const;

 private:
  std::optional<int64_t> step_of(const std::string& file_name) const;
  bool better(double a, double b) const;  // a strictly better than b
  std::optional<CheckpointEntry> best_of(const std::vector<CheckpointEntry>& entries) const;
  void warn(const std::string& message) const;
  void remove_stale_temp_files_with_warning() const;

  std::filesystem::path dir_;
  CheckpointDirOptions options_;
  CheckpointRun run_;
};

}  // namespace lockstep::runtime
