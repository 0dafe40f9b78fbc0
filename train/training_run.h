// Starting a training run whose checkpoints belong to it: a new run, a
// resumed one, or a restart, agreed by every rank before any training.
//
//   train::TrainingRun run = train::open_training_run(
//       "ckpt", {.keep_last = 2, .best = runtime::BestMode::max},
//       {.resume = resume, .restart = restart, .job = distributed::read_job_id()},
//       *group);                                                  // every rank
//   ... fill unset options from run.saved, build the optimizer and schedule ...
//   for (auto& c : train::record_run_settings(run, settings))        // every rank
//     print("{} {} replaces the saved {}", c.name, c.now, c.saved);
//   if (run.resume_from)
//     progress = train::load_training_checkpoint(run.resume_from->path, parts, *group);
//   ... train::save_training_checkpoint(run.dir, parts, progress, metric, *group) ...
//
// What open_training_run decides, on rank 0, for every rank:
//   - the directory must be creatable and writable by rank 0, or it throws;
//   - no other run may be using it: rank 0 holds its lock while the run lives
//     (run_dir_lock.h), and a second run is refused, naming the holder,
//     before it touches anything in the directory;
//   - with a job id (lockstep-run's LOCKSTEP_JOB_ID, which stays the same
//     across --max-restarts attempts) and checkpoints that this job saved in
//     the directory: the job was restarted, and whatever resume and restart
//     say, the run those checkpoints belong to continues from its newest
//     checkpoint that loads (nothing is refused or moved: the job's first
//     attempt did that already). Otherwise the rules below apply, exactly as
//     on the job's first attempt: a restart that comes before the first
//     attempt saved anything decides again, so a refusal stays a refusal and
//     a --restart whose first attempt died before moving the files moves them;
//   - without resume or restart, a directory holding any checkpoint file
//     (another run's, one saved before runs had ids, a damaged one) is
//     refused with a message that lists what is there and the ways out;
//   - with restart, those files move into a subdirectory (nothing deleted)
//     and a new run starts;
//   - with resume: no checkpoint at all starts a new run; files of more than
//     one run are refused; otherwise the run's newest checkpoint that loads
//     (verified in full) is picked, and when none loads it throws, naming
//     every file and why it does not load. A file saved before runs had ids
//     is adopted (with a note): its settings cannot be checked, and its
//     files are never deleted by the new saves' retention;
//   - a resume, either way, moves the files whose header does not read at
//     steps above its pick into a subdirectory "<prefix>-unreadable" (deleting
//     nothing): the run saves those steps again, and a save never replaces a
//     file it cannot tell is the run's own.
// record_run_settings then refuses a resume whose fixed settings differ
// (run_settings.h; the world size is always one, the data digest one where
// the program records it) and returns the changes.
// Every rank throws when one does: rank 0 with the reason, the others naming
// rank 0's output; and all of them when the ranks name different directories
// (two models on groups from new_group() each open their run over their
// own). Rank 0 alone writes; the other ranks open the directory read-only
// and must see the files rank 0 picked.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/collectives/process_group.h"
#include "lockstep/runtime/checkpoint/checkpoint_dir.h"
#include "lockstep/train/run_dir_lock.h"
#include "lockstep/train/run_settings.h"

namespace lockstep::train {

struct TrainingRunOptions {
  bool resume = false;   // continue the run whose checkpoints are in the directory
  bool restart = false;  // move the directory's checkpoints aside and start a new run
  // How the program's user asks for each, for messages: "add --resume".
  std::string resume_hint = "resume the run";
  std::string restart_hint = "restart (which moves the old files into a subdirectory)";
  // The job this process belongs to (distributed::read_job_id(): one launch
  // of lockstep-run, restarts included); recorded in every save. Empty: the
  // run is not tied to a job, and resume and restart alone decide.
  std::string job;
  // Whether the program's user chose the directory's keep_last. When not, a
  // resumed run keeps the number it recorded: its next save would otherwise
  // delete checkpoints the run was started to keep.
  bool keep_last_given = true;
};

struct TrainingRun {
  runtime::CheckpointDir dir;  // saves go here (rank 0 writes)
  // The checkpoint to continue from; null: a new run, from scratch.
  std::optional<runtime::CheckpointEntry> resume_from;
  // resume_from's run id and settings; empty or null for a new run, and for
  // a checkpoint saved before runs recorded them.
  std::string run_id;
  std::optional<RunSettings> saved;
  // Whether the run continues from checkpoints that this job saved (an
  // attempt restarted by lockstep-run --max-restarts); the same on every rank.
  bool continues_job = false;
  // What the user should know, one line each: what rank 0 decided (rank 0
  // only), then what record_run_settings found (every rank).
  std::vector<std::string> notes;
  int world_size = 1;
  RunDirLock lock;  // rank 0's: no other run writes the directory while this one lives
};

// Every rank of `group` calls it. See above.
TrainingRun open_training_run(const std::filesystem::path& dir,
                              runtime::CheckpointDirOptions dir_options,
                              const TrainingRunOptions& options,
                              collectives::ProcessGroup& group);

// Every rank calls it with the same `now`, before the first save. Adds the
// world size to now.fixed; for a resumed run, compares with run.saved
// (throwing on any fixed difference, compare_run_settings) and keeps the
// saved value of each changeable setting `now` lacks. The run's later saves
// record the result under the run's id. Returns the changeable settings that
// differ from the saved ones (none for a new run). A resumed checkpoint that
// records no data digest where `now` has one adds a note to run.notes.
std::vector<SettingChange> record_run_settings(TrainingRun& run, RunSettings now);

}  // namespace lockstep::train
