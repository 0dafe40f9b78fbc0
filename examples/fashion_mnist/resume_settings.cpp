#include "resume_settings.h"

#include <map>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "lockstep/runtime/error.h"
#include "common/saved_settings.h"
#include "optimizer_setup.h"

namespace fashion_mnist {

using namespace lockstep;

namespace {

std::string on_off(bool b) { return b ? "on" : "off"; }

std::string optimizer_setting(const Options& o) {
  if (o.optimizer == "sgd")
    return fmt::format("sgd momentum={} weight_decay={}", o.momentum, weight_decay(o));
  return fmt::format("{} weight_decay={}", o.optimizer, weight_decay(o));
}

}  // namespace

train::RunSettings run_settings(const Options& o, int64_t train_samples, int64_t test_samples,
                                const std::string& data_digest,
                                const optim::LRScheduler* scheduler) {
  return {.fixed = {{"model", o.model},
                    {"sync_bn", on_off(o.sync_bn)},
                    {"batch_size", std::to_string(o.batch_size)},
                    {"train_samples", std::to_string(train_samples)},
                    {"test_samples", std::to_string(test_samples)},
                    {"optimizer", optimizer_setting(o)},
                    {"zero", on_off(o.zero)},
                    {"lr_schedule", train::schedule_setting(scheduler)},
                    {train::kDataSetting, o.data},
                    {train::kDataDigestSetting, data_digest},
                    {"seed", std::to_string(o.seed)}},
          .changeable = {{"lr", fmt::format("{}", learning_rate(o))},
                         {"epochs", std::to_string(o.epochs)},
                         {"clip_grad_norm", fmt::format("{}", o.clip_grad_norm)},
                         {"log_every", std::to_string(o.log_every)},
                         {"checkpoint_every", std::to_string(o.checkpoint_every)},
                         {"threads", std::to_string(o.threads)}}};
}

void take_saved_settings(Options& o, const train::RunSettings& saved) {
  const examples::SavedSettings s(saved, o.given);
  s.take("lr", "lr", o.lr);
  s.take("epochs", "epochs", o.epochs);
  s.take("clip_grad_norm", "clip_grad_norm", o.clip_grad_norm);
  s.take("log_every", "log_every", o.log_every);
  s.take("checkpoint_every", "checkpoint_every", o.checkpoint_every);
  // OpenBLAS splits a product's sums by its thread count: another count
  // changes the last bits.
  s.take("threads", "threads", o.threads);
  s.take("model", "model", o.model);
  s.take("sync_bn", "sync_bn", o.sync_bn);
  s.take("batch_size", "batch_size", o.batch_size);
  s.take("train_samples", "train_samples", o.train_samples);
  s.take("test_samples", "test_samples", o.test_samples);
  s.take("zero", "zero", o.zero);
  s.take("seed", "seed", o.seed);
  s.take("data", train::kDataSetting, o.data);
  s.take("optimizer", "optimizer", o.optimizer, "");
  s.take("momentum", "optimizer", o.momentum, "momentum");
  double decay = 0;
  if (s.take("weight_decay", "optimizer", decay, "weight_decay")) o.weight_decay = decay;
  // The schedule's recorded name back to its --lr-schedule, and the part of
  // it that --warmup-steps set.
  const std::map<std::string, std::pair<std::string, std::string>> schedules = {
      {"none", {"none", ""}},           {"StepLR", {"step", ""}},
      {"MultiStepLR", {"multistep", ""}}, {"CosineLR", {"cosine", ""}},
      {"LinearLR", {"warmup", "total_steps"}}, {"WarmupCosineLR", {"warmup-cosine", "warmup_steps"}},
      {"OneCycleLR", {"onecycle", ""}}};
  const auto saved_name = s.text("", "lr_schedule", "");
  if (!saved_name || !schedules.contains(*saved_name)) return;
  const auto& [schedule, warmup_part] = schedules.at(*saved_name);
  if (!o.given.contains("lr_schedule")) o.lr_schedule = schedule;
  if (o.lr_schedule == schedule && !warmup_part.empty())
    s.take("warmup_steps", "lr_schedule", o.warmup_steps, warmup_part);
}

std::string schedule_change_notes(const train::RunSettings& saved,
                                  const train::RunSettings& now) {
  auto value = [](const std::map<std::string, std::string>& m, const std::string& name) {
    const auto it = m.find(name);
    return it == m.end() ? std::string() : it->second;
  };
  const std::string schedule_was = value(saved.fixed, "lr_schedule");
  const std::string schedule_is = value(now.fixed, "lr_schedule");
  // The same schedule ("CosineLR(...)"), with other settings.
  auto type = [](const std::string& schedule) { return schedule.substr(0, schedule.find('(')); };
  if (schedule_was.empty() || schedule_was == schedule_is ||
      type(schedule_was) != type(schedule_is))
    return {};
  std::string notes;
  // A changeable option that moves a fixed part of the schedule.
  const auto note = [&](const std::string& option, const std::string& what) {
    const std::string was = value(saved.changeable, option), is = value(now.changeable, option);
    if (was.empty() || is.empty() || was == is) return;
    notes += fmt::format(
        "\n--{0} {1} (the run was saved with {2}) changes lr_schedule's {3}, which cannot "
        "change midway. Leave --{0} out (or give --{0} {2}) to finish the run as planned, or "
        "start a new run with --{0} {1} in another checkpoint directory.",
        option, is, was, what);
  };
  note("epochs", "length (it spans the run's steps)");
  if (type(schedule_is) == "OneCycleLR") note("lr", "peak rate (onecycle's max_lr)");
  return notes;
}

}  // namespace fashion_mnist
