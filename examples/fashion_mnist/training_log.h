// The run's curve as JSON (--log-json FILE): every progress window's mean
// loss and throughput and every epoch's test accuracy, with the settings that
// produced them, for scripts/plot-benchmarks. Rank 0 writes it; the file is
// replaced whole (runtime/checkpoint/atomic_file.h) after every epoch and
// before every checkpoint, so a run stopped midway leaves all it logged up to
// its newest checkpoint, and a resumed run keeps that (continue_from).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace fashion_mnist {

class TrainingLog {
 public:
  // An empty path logs nothing (every call below does nothing).
  TrainingLog(std::filesystem::path path, nlohmann::json settings);

  // A resumed run goes on with the curve the file holds: its windows and
  // epochs up to `step` (the checkpoint's; later ones are trained again), and
  // elapsed time from theirs. A file that is not this program's log, or none,
  // leaves the log empty.
  void continue_from(int64_t step);
  // One progress window ending at `step` (global, counted from the run's
  // first step, across a resume).
  void window(int epoch, int64_t step, double mean_loss, double samples_per_s);
  // The test accuracy after `epoch` (1-based); writes the file.
  void epoch_end(int epoch, int64_t step, double test_accuracy);
  // Writes the file now; call it before saving a checkpoint, so that a resume
  // from that checkpoint finds every window up to its step in the file.
  void write() const;

 private:
  double elapsed_s() const;

  std::filesystem::path path_;
  nlohmann::json doc_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace fashion_mnist
