// Training checkpoints: everything needed to resume a run exactly, in one
// checkpoint file (runtime/checkpoint) that rank 0 writes and every rank
// reads.
//
//   runtime::CheckpointDir dir("ckpt", {.keep_last = 2, .best = runtime::BestMode::max});
//   optim::TrainingParts parts{.model = model.get(), .optimizer = &opt, .scheduler = &sched};
//   ...
//   optim::save_training_checkpoint(dir, parts, {.epoch = e, .batch = 0, .step = s},
//                                   accuracy, group.get());          // every rank calls it
//   ...
//   if (auto last = dir.latest())
//     progress = optim::load_training_checkpoint(last->path, parts);  // every rank
//
// What the file holds: tensors "model.<name>" (the model's state_dict:
// parameters and buffers) and "optimizer.state.<i>.<key>"; metadata with the
// optimizer's parameter groups and type, the scheduler's state, the progress
// below, and the random generators' seeds and positions. Python reads the
// weights as any safetensors file.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/collectives/process_group.h"
#include "lockstep/nn/module.h"
#include "lockstep/optim/lr_scheduler.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/runtime/checkpoint/checkpoint_dir.h"
#include "lockstep/runtime/random.h"

namespace lockstep::optim {

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
  Optimizer* optimizer = nullptr;
  LRScheduler* scheduler = nullptr;
  std::vector<runtime::Generator*> generators{&runtime::default_generator()};
};

// The checkpoint content for `parts` at `progress` (the optimizer's full
// state must be available here: on rank 0 after consolidation under ZeRO).
runtime::CheckpointContent training_checkpoint_content(const TrainingParts& parts,
                                                       const TrainingProgress& progress);
// Checks `content` against `parts` (every tensor name, shape and dtype, the
// optimizer's type and groups, the scheduler's type), then restores them all;
// on error nothing has changed. Returns the saved progress.
TrainingProgress restore_training_checkpoint(const runtime::CheckpointContent& content,
                                             const TrainingParts& parts, const std::string& file);

// Every rank calls it (with `group`; null for one process). Rank 0 writes
// through `dir` as checkpoint progress.step with `metric`; the others wait
// for it, and every rank then returns the entry or throws rank 0's failure.
runtime::CheckpointEntry save_training_checkpoint(runtime::CheckpointDir& dir,
                                                  const TrainingParts& parts,
                                                  const TrainingProgress& progress,
                                                  std::optional<double> metric,
                                                  collectives::ProcessGroup* group);
// Every rank reads the file itself (a path all ranks can reach) onto its own
// parameters' device.
TrainingProgress load_training_checkpoint(const std::filesystem::path& path,
                                          const TrainingParts& parts);

}  // namespace lockstep::optim
