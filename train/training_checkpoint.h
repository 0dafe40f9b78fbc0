// Training checkpoints: everything needed to resume a run exactly, in one
// checkpoint file (runtime/checkpoint) that rank 0 writes and every rank
// reads.
//
//   runtime::CheckpointDir dir("ckpt", {.keep_last = 2, .best = runtime::BestMode::max});
//   train::TrainingParts parts{.model = model.get(), .optimizer = &opt, .scheduler = &sched};
//   ...
//   train::save_training_checkpoint(dir, parts, {.epoch = e, .batch = 0, .step = s},
//                                   accuracy, *group);          // every rank calls it
//   ...
//   if (auto last = train::latest_training_checkpoint(dir, *group))  // every rank
//     progress = train::load_training_checkpoint(last->path, parts, *group);
//
// A program whose checkpoints must belong to their run (refusing another
// run's directory, checking a resume's settings) starts through
// training_run.h instead of latest_training_checkpoint().
//
// What the file holds: tensors "model.<name>" (the model's state_dict:
// parameters and buffers) and "optimizer.state.<i>.<key>"; metadata with the
// optimizer's parameter groups and type, the scheduler's state and settings,
// the GradScaler's state, the progress below, and every rank's random
// generators (seed and position).
// Python reads the weights as any safetensors file.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/collectives/process_group.h"
#include "lockstep/nn/module.h"
#include "lockstep/optim/grad_scaler.h"
#include "lockstep/optim/lr_scheduler.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/runtime/checkpoint/checkpoint_dir.h"
#include "lockstep/runtime/random.h"

namespace lockstep::train {

// Where training stands; a resumed run continues from here.
struct TrainingProgress {
  int64_t epoch = 0;  // the epoch to continue in (0-based)
  int64_t batch = 0;  // batches of that epoch already trained on: the sampler position
  int64_t step = 0;   // optimizer steps taken in all
  std::optional<double> best_metric;
  std::map<std::string, std::string> user;  // the program's own values
};

// What is saved and restored. Only the model is required. A
// ZeroRedundancyOptimizer is consolidated onto rank 0 for saving and keeps
// its own shard when loading.
struct TrainingParts {
  nn::Module* model = nullptr;
  optim::Optimizer* optimizer = nullptr;
  optim::LRScheduler* scheduler = nullptr;
  optim::GradScaler* scaler = nullptr;  // saved and restored when enabled
  std::vector<runtime::Generator*> generators{&runtime::default_generator()};
};

// One rank's generators, in TrainingParts::generators order: (seed, position).
using GeneratorStates = std::vector<std::pair<uint64_t, uint64_t>>;
GeneratorStates generator_states(const TrainingParts& parts);

// The checkpoint content for `parts` at `progress` (the optimizer's full
// state must be available here: on rank 0 after consolidation under ZeRO).
// `ranks`: every rank's generator states, by rank; empty: this process's only.
runtime::CheckpointContent training_checkpoint_content(const TrainingParts& parts,
                                                       const TrainingProgress& progress,
                                                       const std::vector<GeneratorStates>& ranks = {});
// What a restore changes on purpose, for settings a resume may change
// (see run_settings.h).
struct RestoreOptions {
  // The learning rate to go on with instead of the saved one: written into
  // every parameter group's "lr" and, with a scheduler, into its base rates,
  // so that the schedule continues from it. Refused with a schedule whose
  // rates do not follow its base rates (OneCycleLR: they come from max_lr),
  // and where the saved groups' rates or base rates differ (a backbone below
  // its head, layer-wise decay), which one rate would flatten.
  std::optional<double> lr;
};

// Checks `content` against `parts` (every tensor name, shape and dtype, the
// optimizer's update rule (its type; a ZeroRedundancyOptimizer's inner one),
// groups and state, the scheduler's type and settings, the GradScaler's state),
// then restores them all; on error nothing has changed. A run saved with a
// scheduler is restored with an optimizer only together with its scheduler
// (the model alone needs neither). Rank `rank` of
// `world` takes its own generator states when the file has one per rank for
// that many ranks, and rank 0's otherwise (a run resumed on another number of
// ranks continues, but not bit for bit; open_training_run refuses that).
// Returns the saved progress.
TrainingProgress restore_training_checkpoint(const runtime::CheckpointContent& content,
                                             const TrainingParts& parts, const std::string& file,
                                             int rank = 0, int world = 1,
                                             const RestoreOptions& options = {});

// Every rank of `group` calls it (a one-rank group alone). Rank 0 writes
// through `dir` as checkpoint progress.step with `metric`; the others wait
// for it, and every rank then returns the entry or throws rank 0's failure.
// A model with a NaN or infinite parameter is not written (the run has
// diverged; the newest checkpoint stays the last good one): every rank
// throws, naming the parameters. Every rank must pass the same directory
// (checked; two models on groups from new_group() each save over their own
// group). runtime::CheckpointDir::save writes anything.
runtime::CheckpointEntry save_training_checkpoint(runtime::CheckpointDir& dir,
                                                  const TrainingParts& parts,
                                                  const TrainingProgress& progress,
                                                  std::optional<double> metric,
                                                  collectives::ProcessGroup& group);
// The checkpoint to resume from, the same on every rank: rank 0 picks the
// newest one that loads (CheckpointDir::latest()) and tells the others; every
// rank of `group` calls it with the same directory (checked, as for a save),
// and all throw, naming the ranks, when some rank cannot see the file rank 0
// picked.
std::optional<runtime::CheckpointEntry> latest_training_checkpoint(
    const runtime::CheckpointDir& dir, collectives::ProcessGroup& group);
// Every rank calls it: returns when every rank of `group` names the same
// checkpoint directory `dir`, and otherwise throws on every rank, naming each
// rank's, with `caller` (the group's rank 0 decides and writes for all).
void check_same_directory(const std::filesystem::path& dir, collectives::ProcessGroup& group,
                          const std::string& caller);
// Every rank calls it: returns when every rank sees `path` as a file, and
// otherwise throws on every rank, naming the ranks that do not.
void check_every_rank_sees(const std::filesystem::path& path, collectives::ProcessGroup& group);
// Every rank reads the file itself (a path all ranks can reach) onto its own
// parameters' device; `group` tells it its rank.
TrainingProgress load_training_checkpoint(const std::filesystem::path& path,
                                          const TrainingParts& parts,
                                          collectives::ProcessGroup& group,
                                          const RestoreOptions& options = {});

}  // namespace lockstep::train
