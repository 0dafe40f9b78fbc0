#include "training_log.h"

#include <string>
#include <utility>

#include "lockstep/runtime/checkpoint/atomic_file.h"
#include "lockstep/runtime/checkpoint/file_io.h"

namespace fashion_mnist {

TrainingLog::TrainingLog(std::filesystem::path path, nlohmann::json settings)
    : path_(std::move(path)) {
  if (path_.empty()) return;
  doc_ = {{"program", "fashion_mnist"},
          {"settings", std::move(settings)},
          {"windows", nlohmann::json::array()},
          {"epochs", nlohmann::json::array()}};
  // A path that cannot take the file fails now, not after an epoch.
  lockstep::runtime::check_can_write_file(path_);
}

void TrainingLog::window(int epoch, int64_t step, double mean_loss, double samples_per_s) {
  if (path_.empty()) return;
  doc_["windows"].push_back({{"epoch", epoch},
                             {"step", step},
                             {"loss", mean_loss},
                             {"samples_per_s", samples_per_s},
                             {"elapsed_s", elapsed_s()}});
}

void TrainingLog::epoch_end(int epoch, int64_t step, double test_accuracy) {
  if (path_.empty()) return;
  doc_["epochs"].push_back({{"epoch", epoch},
                            {"step", step},
                            {"test_accuracy", test_accuracy},
                            {"elapsed_s", elapsed_s()}});
  write();
}

void TrainingLog::write() const {
  const std::string text = doc_.dump(2) + "\n";
  lockstep::runtime::write_file_atomically(path_, [&](int fd, const std::string& temp) {
    lockstep::runtime::write_all(fd, text.data(), text.size(), temp);
  });
}

double TrainingLog::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

}  // namespace fashion_mnist
