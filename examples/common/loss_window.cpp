#include "loss_window.h"

#include <charconv>
#include <optional>

#include "lockstep/runtime/checkpoint/metadata_text.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/tensor.h"

namespace examples {

using namespace lockstep;

namespace {
constexpr const char* kLoss = "log_window_loss";
constexpr const char* kSteps = "log_window_steps";
}  // namespace

void LossWindow::average_over(collectives::ProcessGroup& group) {
  if (group.size() == 1) return;
  auto totals = runtime::Tensor::from_vector<double>({sum, static_cast<double>(steps)}, {2});
  group.allreduce(totals, {.op = collectives::ReduceOp::Sum})->wait();
  const auto t = totals.to_vector<double>();
  LOCKSTEP_CHECK(t[1] == static_cast<double>(steps) * group.size(),
                 "the log window holds {} steps on rank {} but {} over all {} ranks: every rank "
                 "must log after the same steps",
                 steps, group.rank(), t[1], group.size());
  sum = t[0] / group.size();
}

void LossWindow::save_to(train::TrainingProgress& progress) const {
  progress.user[kLoss] = runtime::metadata_number(sum);
  progress.user[kSteps] = std::to_string(steps);
}

LossWindow LossWindow::restore(const train::TrainingProgress& progress, int64_t max_steps,
                               const std::string& file, const std::string& program) {
  LossWindow w;
  if (!progress.user.contains(kLoss)) return w;  // saved before windows were kept
  const std::string& sum = progress.user.at(kLoss);
  const std::string steps = progress.user.contains(kSteps) ? progress.user.at(kSteps) : "";
  const std::optional<double> loss = runtime::parse_metadata_number(sum);
  const auto [end, ec] = std::from_chars(steps.data(), steps.data() + steps.size(), w.steps);
  LOCKSTEP_CHECK(loss && ec == std::errc() && end == steps.data() + steps.size() &&
                     w.steps >= 0 && w.steps <= max_steps,
                 "{}: the saved log window (loss sum \"{}\" over \"{}\" steps) does not read; "
                 "the checkpoint was not written by {}",
                 file, sum, steps, program);
  w.sum = *loss;
  return w;
}

}  // namespace examples
