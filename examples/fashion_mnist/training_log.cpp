#include "training_log.h"

#include <algorithm>
#include <fstream>
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

void TrainingLog::continue_from(int64_t step) {
  if (path_.empty()) return;
  std::ifstream in(path_);
  if (!in) return;
  const nlohmann::json old = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!old.is_object() || old.value("program", "") != "fashion_mnist") return;
  double elapsed = 0;
  for (const char* part : {"windows", "epochs"}) {
    if (!old.contains(part) || !old[part].is_array()) continue;
    for (const auto& entry : old[part]) {
      if (!entry.is_object() || !entry.value("step", nlohmann::json()).is_number_integer() ||
          entry["step"].get<int64_t>() > step)
        continue;
      doc_[part].push_back(entry);
      if (const auto t = entry.find("elapsed_s"); t != entry.end() && t->is_number())
        elapsed = std::max(elapsed, t->get<double>());
    }
  }
  // The time the resumed run trains is added to the time the earlier one took.
  start_ -= std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(elapsed));
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
  if (path_.empty()) return;
  const std::string text = doc_.dump(2) + "\n";
  lockstep::runtime::write_file_atomically(path_, [&](int fd, const std::string& temp) {
    lockstep::runtime::write_all(fd, text.data(), text.size(), temp);
  });
}

double TrainingLog::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

}  // namespace fashion_mnist
