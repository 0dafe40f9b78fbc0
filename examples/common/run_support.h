// What the training examples share: printing from rank 0, opening a run's
// checkpoint directory and recording its settings, clipping through any
// optimizer, stopping a diverged run, and a digest of a model's bytes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "lockstep/nn/module.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/train/training_run.h"

namespace examples {

// Progress lines come from rank 0 only.
template <class... Args>
void print(int rank, fmt::format_string<Args...> format, Args&&... args) {
  if (rank != 0) return;
  fmt::print(format, std::forward<Args>(args)...);
  std::fflush(stdout);
}

struct CheckpointFlags {
  std::string dir;  // empty: no checkpoints
  int keep_last = 2;
  bool keep_last_given = false;  // else a resume keeps the run's
  bool resume = false;
  bool restart = false;
};

// The run in flags.dir (train/training_run.h), with the examples' --resume
// and --restart named in its messages and tied to lockstep-run's job
// (LOCKSTEP_JOB_ID): an attempt restarted by --max-restarts continues the
// run its job saved, and no other. Rank 0 prints its notes. Null without a
// directory. Every rank calls it.
std::optional<lockstep::train::TrainingRun> open_checkpoints(
    const CheckpointFlags& flags, lockstep::runtime::BestMode best,
    lockstep::collectives::ProcessGroup& group);

// train::record_run_settings for every rank, with rank 0 printing each
// changeable setting the command line changed and each note it adds (a
// checkpoint that records no data digest). Returns the changes.
std::vector<lockstep::train::SettingChange> record_settings(lockstep::train::TrainingRun& run,
                                                           lockstep::train::RunSettings now,
                                                           int rank);

// Clips the gradients of every parameter the optimizer steps to a global L2
// norm (across ranks for a ZeroRedundancyOptimizer); returns the norm.
double clip_gradients(lockstep::optim::Optimizer& opt, double max_norm);

// Throws, naming the rank and the step, when a step's loss is NaN or
// infinite: training has diverged, and every later step would train on NaN.
void check_loss_finite(double loss, int64_t step, int rank);

// FNV-1a over every parameter and buffer's bytes: equal digests mean
// bit-identical models (a resumed run against an uninterrupted one).
uint64_t parameters_digest(const lockstep::nn::Module& model);

}  // namespace examples
