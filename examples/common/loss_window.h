// The loss a training example logs every --log-every steps: the mean over the
// steps since its last log line and over the ranks, each rank's step loss
// being the mean over its part of the global batch (all parts the same size),
// so the number is the global batch's loss whatever the world size. The part
// of that window a checkpoint ends in rides in the checkpoint
// (TrainingProgress::user), so a run resumed mid-window logs the very numbers
// an uninterrupted one does.
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/collectives/process_group.h"
#include "lockstep/train/training_checkpoint.h"

namespace examples {

struct LossWindow {
  double sum = 0;
  int64_t steps = 0;

  void add(double loss) {
    sum += loss;
    ++steps;
  }
  double mean() const { return sum / static_cast<double>(steps); }
  void reset() { *this = {}; }
  // Replaces every rank's window with the mean of all ranks' windows (one
  // all-reduce; every rank of `group` calls it, all with the same steps). The
  // mean of windows that are already the same on every rank is that window,
  // so averaging before a checkpoint (which saves rank 0's window) and again
  // at the log line gives the log line the mean over every rank's steps.
  void average_over(lockstep::collectives::ProcessGroup& group);
  // The mean of average_over(group), leaving this window as it is.
  double global_mean(lockstep::collectives::ProcessGroup& group) const {
    LossWindow all = *this;
    all.average_over(group);
    return all.mean();
  }

  // Into the progress a checkpoint is about to be saved with.
  void save_to(lockstep::train::TrainingProgress& progress) const;
  // The window saved in `progress` (empty when it has none); a count past
  // `max_steps`, or text that does not read, is an error naming `file` and
  // `program`, which wrote it.
  static LossWindow restore(const lockstep::train::TrainingProgress& progress, int64_t max_steps,
                            const std::string& file, const std::string& program);
};

}  // namespace examples
