#include "resume_settings.h"

#include <charconv>
#include <string>

#include <fmt/format.h>

#include "lockstep/runtime/error.h"
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

// Reads a saved value into `field` (an integer or a double).
template <class T>
void parse_saved(const std::string& name, const std::string& text, T& field) {
  T value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  LOCKSTEP_CHECK(ec == std::errc{} && end == text.data() + text.size(),
                 "the checkpoint records {} = \"{}\", which is not a number; give --{} on the "
                 "command line",
                 name, text, name);
  field = value;
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
                         {"checkpoint_every", std::to_string(o.checkpoint_every)}}};
}

void take_saved_settings(Options& o, const train::RunSettings& saved) {
  auto take = [&](const std::string& name, auto& field) {
    auto it = saved.changeable.find(name);
    if (o.given.contains(name) || it == saved.changeable.end()) return;
    parse_saved(name, it->second, field);
  };
  take("lr", o.lr);
  take("epochs", o.epochs);
  take("clip_grad_norm", o.clip_grad_norm);
  take("log_every", o.log_every);
  take("checkpoint_every", o.checkpoint_every);
}

}  // namespace fashion_mnist
