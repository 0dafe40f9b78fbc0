#include "lockstep/train/training_run.h"

#include <charconv>
#include <map>
#include <set>

#include <fmt/format.h>

#include "lockstep/collectives/rank_text.h"
#include "lockstep/runtime/checkpoint/atomic_file.h"
#include "lockstep/runtime/error.h"
#include "lockstep/train/training_checkpoint.h"

namespace lockstep::train {

namespace fs = std::filesystem;
using runtime::CheckpointEntry;

namespace {

// What rank 0 decided: the checkpoint to resume from (none: a new run) and
// what to tell the user.
struct Decision {
  std::optional<fs::path> pick;
  bool continues_job = false;  // pick is of the run this job was saving
  std::vector<std::string> notes;
};

// The keep_last a checkpoint recorded; one that is not a whole number >= 1
// is refused rather than guessed.
int keep_last_of(const std::string& text, const std::string& file) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  LOCKSTEP_CHECK(ec == std::errc() && end == text.data() + text.size() && value >= 1,
                 "{} records keep_last '{}', which is not a whole number of at least 1; choose "
                 "how many checkpoints to keep on the command line",
                 file, text);
  return value;
}

// "<path>: <why>", where the message does not start so already.
std::string about(const fs::path& file, const std::string& message) {
  const std::string head = file.string() + ": ";
  return message.starts_with(head) ? message : head + message;
}

std::string steps_of(const std::vector<const CheckpointEntry*>& files) {
  const int64_t first = files.front()->step, last = files.back()->step;
  return first == last ? fmt::format("step {}", first) : fmt::format("steps {} to {}", first, last);
}

// What a directory holds, one part per run and per kind of file without one:
// "run 3f..: 3 file(s), steps 100 to 300; 1 file(s) whose header does not read: ckpt-..".
std::string describe_contents(const std::vector<CheckpointEntry>& entries) {
  std::map<std::string, std::vector<const CheckpointEntry*>> by_run;
  std::vector<const CheckpointEntry*> without_id, unreadable;
  for (const auto& e : entries) {
    if (!e.unreadable.empty())
      unreadable.push_back(&e);
    else if (e.run_id)
      by_run[*e.run_id].push_back(&e);
    else
      without_id.push_back(&e);
  }
  std::vector<std::string> parts;
  for (const auto& [id, files] : by_run)
    parts.push_back(fmt::format("run {}: {} file(s), {}", id, files.size(), steps_of(files)));
  if (!without_id.empty())
    parts.push_back(fmt::format("{} file(s) saved without a run id, {}", without_id.size(),
                                steps_of(without_id)));
  if (!unreadable.empty()) {
    std::string names;
    for (const auto* e : unreadable)
      names += (names.empty() ? "" : ", ") + e->path.filename().string();
    parts.push_back(fmt::format("{} file(s) whose header does not read: {}", unreadable.size(), names));
  }
  std::string text;
  for (const auto& p : parts) text += (text.empty() ? "" : "; ") + p;
  return text;
}

Decision start_new(runtime::CheckpointDir& dir, const TrainingRunOptions& options,
                   const std::vector<CheckpointEntry>& entries) {
  if (entries.empty()) return {};
  LOCKSTEP_CHECK(options.restart,
                 "checkpoint directory {} already holds checkpoints of another run ({}). To "
                 "continue that run, {}; to start a new run, use another checkpoint directory, "
                 "or {}.",
                 dir.path().string(), describe_contents(entries), options.resume_hint,
                 options.restart_hint);
  const std::string what = describe_contents(entries);
  const fs::path moved_to = dir.set_aside();
  return {.notes = {fmt::format("moved the {} checkpoint file(s) that were in {} ({}) into {}",
                                entries.size(), dir.path().string(), what, moved_to.string())}};
}

// The newest of `candidates` (by increasing step) that loads, verified in
// full; notes for the newer ones that do not. Throws when none loads.
Decision newest_that_loads(const runtime::CheckpointDir& dir, const TrainingRunOptions& options,
                           const std::vector<const CheckpointEntry*>& candidates) {
  Decision decision;
  std::vector<std::string> failures;
  const CheckpointEntry* picked = nullptr;
  for (auto it = candidates.rbegin(); it != candidates.rend() && !picked; ++it) {
    try {
      (void)runtime::load_checkpoint((*it)->path);  // verifies every checksum
      picked = *it;
    } catch (const Error& e) {
      failures.push_back(about((*it)->path, e.what()));
    }
  }
  if (!picked) {
    std::string list;
    for (const auto& f : failures) list += "\n  " + f;
    throw Error(fmt::format(
        "cannot resume: no checkpoint in {} loads ({} file(s) tried):{}\nNothing was changed or "
        "deleted. To start a new run instead, use another checkpoint directory, or {}.",
        dir.path().string(), failures.size(), list, options.restart_hint));
  }
  decision.pick = picked->path;
  for (const auto& f : failures)
    decision.notes.push_back("skipped a checkpoint that does not load: " + f);
  if (!picked->run_id)
    decision.notes.push_back(fmt::format(
        "{} was saved without a run id (by an earlier version): continuing it as a new run; its "
        "settings cannot be checked, and files without a run id stay as they are",
        picked->path.string()));
  return decision;
}

Decision pick_to_resume(const runtime::CheckpointDir& dir, const TrainingRunOptions& options,
                        const std::vector<CheckpointEntry>& entries) {
  if (entries.empty())
    return {.notes = {fmt::format("no checkpoint in {} yet: starting a new run", dir.path().string())}};
  std::set<std::string> runs;
  for (const auto& e : entries)
    if (e.run_id) runs.insert(*e.run_id);
  LOCKSTEP_CHECK(runs.size() <= 1,
                 "cannot resume: checkpoint directory {} holds checkpoints of {} runs ({}); a "
                 "resume continues one run: move the others' files into another directory",
                 dir.path().string(), runs.size(), describe_contents(entries));
  // The run's files, and those whose header does not say whose they are.
  // Files saved without a run id are candidates only where no run has one.
  std::vector<const CheckpointEntry*> candidates;
  for (const auto& e : entries)
    if (runs.empty() || !e.unreadable.empty() || e.run_id == *runs.begin())
      candidates.push_back(&e);
  return newest_that_loads(dir, options, candidates);
}

// The run whose checkpoints this job saved (on an earlier attempt, before
// lockstep-run restarted it), or nullopt when it saved none here.
std::optional<std::string> run_of_job(const runtime::CheckpointDir& dir, const std::string& job,
                                      const std::vector<CheckpointEntry>& entries) {
  if (job.empty()) return std::nullopt;
  std::set<std::string> runs;
  for (const auto& e : entries)
    if (e.job_id == job && e.run_id) runs.insert(*e.run_id);
  if (runs.empty()) return std::nullopt;
  // One job trains one run; two mean files were copied or edited by hand.
  LOCKSTEP_CHECK(runs.size() == 1,
                 "cannot continue job {}: checkpoint directory {} holds checkpoints of {} runs "
                 "saved by this job ({}); move the files that are not this job's into another "
                 "directory",
                 job, dir.path().string(), runs.size(), describe_contents(entries));
  return *runs.begin();
}

// A restarted attempt of a job: the job's run goes on from its newest
// checkpoint that loads (one saved by this job or, when the job resumed the
// run, an earlier one of the same run).
Decision continue_job(const runtime::CheckpointDir& dir, const TrainingRunOptions& options,
                      const std::vector<CheckpointEntry>& entries, const std::string& run_id) {
  std::vector<const CheckpointEntry*> candidates;
  for (const auto& e : entries)
    if (e.run_id == run_id) candidates.push_back(&e);
  Decision decision = newest_that_loads(dir, options, candidates);
  decision.continues_job = true;
  decision.notes.insert(decision.notes.begin(),
                        fmt::format("job {} was saving run {} in {}: continuing it", options.job,
                                    run_id, dir.path().string()));
  return decision;
}

// Files whose header does not read, at steps above the one the run resumes
// from: the run saves those steps again, and a save never replaces a file it
// cannot tell is its own, so each would stop the run there, its work since the
// resume lost. They move into a new subdirectory "<prefix>-unreadable[-N]"
// (nothing is deleted); returns a note, empty when there was none.
std::string move_unreadable_above(const fs::path& dir, const std::string& prefix,
                                  const std::vector<CheckpointEntry>& entries, int64_t step) {
  std::vector<const CheckpointEntry*> blocking;
  for (const auto& e : entries)
    if (!e.unreadable.empty() && e.step > step) blocking.push_back(&e);
  if (blocking.empty()) return {};
  fs::path target = dir / (prefix + "-unreadable");
  std::error_code ec;
  for (int n = 2; !fs::create_directory(target, ec); ++n) {
    LOCKSTEP_CHECK(!ec && n < 1000, "cannot create {} to move unreadable checkpoints into: {}",
                   target.string(), ec ? ec.message() : "too many folders of that name");
    target = dir / fmt::format("{}-unreadable-{}", prefix, n);
  }
  std::string names;
  for (const auto* e : blocking) {
    fs::rename(e->path, target / e->path.filename(), ec);
    LOCKSTEP_CHECK(!ec, "cannot move {}, whose header does not read, into {}: {}; move it away "
                   "by hand, or the resumed run cannot save step {}",
                   e->path.string(), target.string(), ec.message(), e->step);
    names += (names.empty() ? "" : ", ") + e->path.filename().string();
  }
  runtime::fsync_directory(target);
  runtime::fsync_directory(dir);
  return fmt::format("moved {} into {}: {} header does not read, so the resumed run could not "
                     "save over {} when it reaches {} step again",
                     names, target.string(), blocking.size() == 1 ? "its" : "their",
                     blocking.size() == 1 ? "it" : "them", blocking.size() == 1 ? "its" : "their");
}

}  // namespace

TrainingRun open_training_run(const fs::path& path, runtime::CheckpointDirOptions dir_options,
                              const TrainingRunOptions& options, collectives::ProcessGroup& group) {
  const int rank = group.rank();
  const int world = group.size();
  LOCKSTEP_CHECK(!(options.resume && options.restart),
                 "open_training_run: resume and restart exclude each other (resume continues the "
                 "run in {}, restart moves it aside)",
                 path.string());
  if (rank != 0) dir_options.read_only = true;
  check_same_directory(path, group, "open_training_run");

  std::optional<runtime::CheckpointDir> dir;
  RunDirLock lock;
  Decision decision;
  std::string error;
  if (rank == 0) {
    try {
      // The lock before the directory is cleaned: a temporary file of a run
      // writing from another node looks left by a dead writer here, and
      // removing it would fail that run's save. A directory that cannot be
      // made is reported by CheckpointDir.
      std::error_code not_made;
      fs::create_directories(path, not_made);
      if (!not_made) lock = RunDirLock::acquire(path);
      dir.emplace(path, dir_options);
      if (not_made) lock = RunDirLock::acquire(path);  // made since, by someone else
      const auto entries = dir->list();
      if (const auto job_run = run_of_job(*dir, options.job, entries))
        decision = continue_job(*dir, options, entries, *job_run);
      else
        decision = options.resume ? pick_to_resume(*dir, options, entries)
                                  : start_new(*dir, options, entries);
      if (decision.pick) {
        const std::string moved = move_unreadable_above(
            path, dir_options.prefix, entries, dir->entry_for(*decision.pick).step);
        if (!moved.empty()) decision.notes.push_back(moved);
      }
    } catch (const std::exception& e) {
      error = *e.what() ? e.what() : "an error without a message";
    }
  }
  // Rank 0's outcome reaches every rank before anything else happens, the
  // reason included: whichever rank reports first says what is wrong.
  if (const std::string failure = collectives::broadcast_text(error, group); !failure.empty()) {
    if (rank == 0) throw Error(failure);
    throw Error(fmt::format("rank {}: rank 0 could not start the run: {}", rank, failure));
  }
  if (rank != 0) dir.emplace(path, dir_options);
  const std::string picked = collectives::broadcast_text(decision.pick ? decision.pick->string() : "", group);
  const bool continues_job =
      !collectives::broadcast_text(decision.continues_job ? "job" : "", group).empty();

  TrainingRun run{.dir = std::move(*dir),
                  .continues_job = continues_job,
                  .notes = std::move(decision.notes),
                  .world_size = world,
                  .lock = std::move(lock)};
  if (!picked.empty()) {
    check_every_rank_sees(picked, group);
    // Each rank reads the run and its settings from the header itself.
    run.resume_from = run.dir.entry_for(picked);
    const auto metadata = runtime::read_safetensors_header(picked).metadata;
    if (auto it = metadata.find(runtime::kRunKey); it != metadata.end()) run.run_id = it->second;
    run.saved = read_run_settings(metadata);
    if (!options.keep_last_given && run.saved) {
      if (const auto it = run.saved->changeable.find(kKeepLastSetting);
          it != run.saved->changeable.end())
        run.dir.set_keep_last(keep_last_of(it->second, picked));
    }
  }
  // Saves continue the resumed run, even where no settings are recorded, and
  // name the job that saved them.
  run.dir.set_run({.id = run.run_id, .job = options.job});
  return run;
}

std::vector<SettingChange> record_run_settings(TrainingRun& run, RunSettings now) {
  now.fixed[kWorldSizeSetting] = std::to_string(run.world_size);
  now.changeable[kKeepLastSetting] = std::to_string(run.dir.keep_last());
  std::vector<SettingChange> changes;
  if (run.saved) {
    changes = compare_run_settings(*run.saved, now, run.resume_from->path.string());
    const auto digest = now.fixed.find(kDataDigestSetting);
    if (digest != now.fixed.end() && !run.saved->fixed.contains(kDataDigestSetting))
      run.notes.push_back(fmt::format(
          "{} records no digest of the run's data (saved by an earlier version): the data "
          "under {} cannot be checked against what the run started with; later checkpoints "
          "record its digest {}",
          run.resume_from->path.string(),
          now.fixed.contains(kDataSetting) ? now.fixed.at(kDataSetting) : "its path",
          digest->second));
    for (const auto& [name, value] : run.saved->changeable) now.changeable.try_emplace(name, value);
  }
  run.dir.set_run(
      {.id = run.run_id, .job = run.dir.run().job, .metadata = run_settings_metadata(now)});
  return changes;
}

}  // namespace lockstep::train
