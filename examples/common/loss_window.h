// The loss a training example logs every --log-every steps: the mean over the
// steps since its last log line. The part of that window a checkpoint ends in
// rides in the checkpoint (TrainingProgress::user), so a run resumed mid-window
// logs the very numbers an uninterrupted one does.
#pragma once

#include <cstdint>
#include <string>

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

  // Into the progress a checkpoint is about to be saved with.
  void save_to(lockstep::train::TrainingProgress& progress) const;
  // The window saved in `progress` (empty when it has none); a count past
  // `max_steps`, or text that does not read, is an error naming `file` and
  // `program`, which wrote it.
  static LossWindow restore(const lockstep::train::TrainingProgress& progress, int64_t max_steps,
                            const std::string& file, const std::string& program);
};

}  // namespace examples
