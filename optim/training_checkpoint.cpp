#include "lockstep/optim/training_checkpoint.h"

#include <charconv>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lockstep/optim/zero_redundancy_optimizer.h"
#include "lockstep/runtime/error.h"

namespace lockstep::optim {

using runtime::CheckpointContent;
using runtime::NamedTensors;
using runtime::Device;

namespace {

constexpr const char* kFormatKey = "training.format";
constexpr const char* kFormat = "lockstep-training-1";
constexpr std::string_view kModelPrefix = "model.";
constexpr std::string_view kStatePrefix = "optimizer.state.";

// Doubles as text that reads back to the same bits.
std::string number(double v) { return fmt::format("{:.17g}", v); }

// The metadata a checkpoint must have, with a message naming the file.
class Metadata {
 public:
  Metadata(const std::map<std::string, std::string>& m, const std::string& file)
      : m_(m), file_(file) {}

  bool has(const std::string& key) const { return m_.contains(key); }
  const std::string& text(const std::string& key) const {
    auto it = m_.find(key);
    LOCKSTEP_CHECK(it != m_.end(),
                   "checkpoint {}: metadata \"{}\" is missing; the file is not a training "
                   "checkpoint of this version (or was written by another tool)",
                   file_, key);
    return it->second;
  }
  template <class T>
  T integer(const std::string& key) const {
    const std::string& s = text(key);
    T v{};
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    LOCKSTEP_CHECK(ec == std::errc{} && end == s.data() + s.size(),
                   "checkpoint {}: metadata \"{}\" = \"{}\" is not an integer", file_, key, s);
    return v;
  }
  double real(const std::string& key) const {
    const std::string& s = text(key);
    try {
      size_t used = 0;
      const double v = std::stod(s, &used);
      if (used == s.size()) return v;
    } catch (const std::exception&) {
    }
    throw Error(fmt::format("checkpoint {}: metadata \"{}\" = \"{}\" is not a number", file_, key, s));
  }
  // Every key under `prefix`, without it.
  std::map<std::string, std::string> under(const std::string& prefix) const {
    std::map<std::string, std::string> out;
    for (auto it = m_.lower_bound(prefix); it != m_.end() && it->first.starts_with(prefix); ++it)
      out[it->first.substr(prefix.size())] = it->second;
    return out;
  }

 private:
  const std::map<std::string, std::string>& m_;
  const std::string& file_;
};

std::string group_key(size_t g, const std::string& what) {
  return fmt::format("optimizer.group.{}.{}", g, what);
}

void add_optimizer(const Optimizer& opt, CheckpointContent& c) {
  const OptimizerState state = opt.state_dict();
  c.metadata["optimizer.type"] = opt.name();
  c.metadata["optimizer.groups"] = std::to_string(state.param_groups.size());
  for (size_t g = 0; g < state.param_groups.size(); ++g) {
    const auto& group = state.param_groups[g];
    c.metadata[group_key(g, "params")] = fmt::format("{}", fmt::join(group.params, ","));
    for (const auto& [key, value] : group.options) c.metadata[group_key(g, "option." + key)] = number(value);
  }
  for (const auto& [index, entries] : state.state)
    for (const auto& [key, tensor] : entries)
      c.tensors.emplace_back(fmt::format("{}{}.{}", kStatePrefix, index, key), tensor);
}

std::vector<int64_t> parse_indices(const std::string& text, const std::string& file,
                                   const std::string& key) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    int64_t v = 0;
    auto [end, ec] = std::from_chars(text.data() + pos, text.data() + comma, v);
    LOCKSTEP_CHECK(ec == std::errc{} && end == text.data() + comma,
                   "checkpoint {}: metadata \"{}\" = \"{}\" is not a list of integers", file, key,
                   text);
    out.push_back(v);
    pos = comma + 1;
  }
  return out;
}

OptimizerState read_optimizer(const CheckpointContent& c, const Metadata& meta,
                              const Optimizer& opt, const std::string& file) {
  const std::string saved_type = meta.text("optimizer.type");
  const auto groups = meta.integer<size_t>("optimizer.groups");
  const auto& mine = opt.param_groups();
  LOCKSTEP_CHECK(groups == mine.size(),
                 "checkpoint {}: the saved {} optimizer has {} parameter group(s), this {} has {}; "
                 "build the optimizer as the run that saved it did",
                 file, saved_type, groups, opt.name(), mine.size());
  OptimizerState state;
  for (size_t g = 0; g < groups; ++g) {
    OptimizerState::Group group;
    group.params = parse_indices(meta.text(group_key(g, "params")), file, group_key(g, "params"));
    LOCKSTEP_CHECK(group.params.size() == mine[g].params.size(),
                   "checkpoint {}: saved parameter group {} has {} parameter(s), this optimizer's "
                   "has {}",
                   file, g, group.params.size(), mine[g].params.size());
    for (const auto& [key, text] : meta.under(group_key(g, "option."))) {
      LOCKSTEP_CHECK(mine[g].options.contains(key),
                     "checkpoint {}: the saved {} optimizer has option \"{}\", which this {} does "
                     "not know; resume with the optimizer the run was saved with",
                     file, saved_type, key, opt.name());
      group.options[key] = meta.real(group_key(g, "option." + key));
    }
    state.param_groups.push_back(std::move(group));
  }
  for (const auto& [name, tensor] : c.tensors) {
    if (!std::string_view(name).starts_with(kStatePrefix)) continue;
    const std::string rest = name.substr(kStatePrefix.size());
    const size_t dot = rest.find('.');
    int64_t index = -1;
    auto [end, ec] = std::from_chars(rest.data(), rest.data() + std::min(dot, rest.size()), index);
    LOCKSTEP_CHECK(dot != std::string::npos && ec == std::errc{} && end == rest.data() + dot,
                   "checkpoint {}: tensor \"{}\" is not named optimizer.state.<index>.<key>", file,
                   name);
    state.state[index][rest.substr(dot + 1)] = tensor;
  }
  return state;
}

}  // namespace

CheckpointContent training_checkpoint_content(const TrainingParts& parts,
                                              const TrainingProgress& progress) {
  LOCKSTEP_CHECK(parts.model != nullptr, "save_training_checkpoint: TrainingParts has no model");
  CheckpointContent c;
  c.metadata[kFormatKey] = kFormat;
  for (const auto& [name, tensor] : parts.model->state_dict())
    c.tensors.emplace_back(std::string(kModelPrefix) + name, tensor);
  if (parts.optimizer) add_optimizer(*parts.optimizer, c);
  if (parts.scheduler) {
    c.metadata["scheduler.type"] = parts.scheduler->name();
    for (const auto& [key, value] : parts.scheduler->state_dict())
      c.metadata["scheduler.state." + key] = number(value);
  }
  c.metadata["rng.count"] = std::to_string(parts.generators.size());
  for (size_t i = 0; i < parts.generators.size(); ++i) {
    c.metadata[fmt::format("rng.{}.seed", i)] = std::to_string(parts.generators[i]->seed());
    c.metadata[fmt::format("rng.{}.offset", i)] = std::to_string(parts.generators[i]->offset());
  }
  c.metadata["training.epoch"] = std::to_string(progress.epoch);
  c.metadata["training.batch"] = std::to_string(progress.batch);
  c.metadata["training.step"] = std::to_string(progress.step);
  if (progress.best_metric) c.metadata["training.best_metric"] = number(*progress.best_metric);
  for (const auto& [key, value] : progress.user) c.metadata["user." + key] = value;
  return c;
}

TrainingProgress restore_training_checkpoint(const CheckpointContent& c, const TrainingParts& parts,
                                             const std::string& file) {
  LOCKSTEP_CHECK(parts.model != nullptr, "load_training_checkpoint: TrainingParts has no model");
  const Metadata meta(c.metadata, file);
  LOCKSTEP_CHECK(meta.has(kFormatKey) && meta.text(kFormatKey) == kFormat,
                 "checkpoint {}: not a lockstep training checkpoint (metadata \"{}\" is {}); "
                 "load plain weights with runtime::load_checkpoint",
                 file, kFormatKey, meta.has(kFormatKey) ? meta.text(kFormatKey) : "missing");

  // Everything is parsed and checked before anything changes.
  NamedTensors model_tensors;
  for (const auto& [name, tensor] : c.tensors)
    if (std::string_view(name).starts_with(kModelPrefix))
      model_tensors.emplace_back(name.substr(kModelPrefix.size()), tensor);
  const nn::StateDict current = parts.model->state_dict();
  runtime::check_tensors_match(model_tensors, current.items(), file);

  std::optional<OptimizerState> opt_state;
  if (parts.optimizer) {
    LOCKSTEP_CHECK(meta.has("optimizer.type"),
                   "checkpoint {}: holds no optimizer state, but an optimizer was given to "
                   "restore; leave TrainingParts::optimizer null to load the model only",
                   file);
    opt_state = read_optimizer(c, meta, *parts.optimizer, file);
  }
  SchedulerState sched_state;
  if (parts.scheduler) {
    const std::string saved = meta.has("scheduler.type") ? meta.text("scheduler.type") : "none";
    LOCKSTEP_CHECK(saved == parts.scheduler->name(),
                   "checkpoint {}: the run was saved with LR scheduler {}, this one is {}; resume "
                   "with the schedule the run was saved with",
                   file, saved, parts.scheduler->name());
    for (const auto& [key, text] : meta.under("scheduler.state."))
      sched_state[key] = meta.real("scheduler.state." + key);
  }
  const auto rng_count = meta.integer<size_t>("rng.count");
  LOCKSTEP_CHECK(rng_count == parts.generators.size(),
                 "checkpoint {}: holds {} random generator state(s), {} were given to restore",
                 file, rng_count, parts.generators.size());
  std::vector<std::pair<uint64_t, uint64_t>> rng;
  for (size_t i = 0; i < rng_count; ++i)
    rng.emplace_back(meta.integer<uint64_t>(fmt::format("rng.{}.seed", i)),
                     meta.integer<uint64_t>(fmt::format("rng.{}.offset", i)));
  TrainingProgress progress{.epoch = meta.integer<int64_t>("training.epoch"),
                            .batch = meta.integer<int64_t>("training.batch"),
                            .step = meta.integer<int64_t>("training.step")};
  if (meta.has("training.best_metric")) progress.best_metric = meta.real("training.best_metric");
  progress.user = meta.under("user.");

  parts.model->load_state_dict(nn::StateDict(model_tensors));
  if (parts.optimizer) parts.optimizer->load_state_dict(*opt_state);
  if (parts.scheduler) parts.scheduler->load_state_dict(sched_state);
  for (size_t i = 0; i < rng_count; ++i) {
    parts.generators[i]->manual_seed(rng[i].first);
    parts.generators[i]->set_offset(rng[i].second);
  }
  return progress;
}

runtime::CheckpointEntry save_training_checkpoint(runtime::CheckpointDir& dir,
                                                  const TrainingParts& parts,
                                                  const TrainingProgress& progress,
                                                  std::optional<double> metric,
                                                  collectives::ProcessGroup* group) {
  const int rank = group ? group->rank() : 0;
  if (auto* zero = dynamic_cast<ZeroRedundancyOptimizer*>(parts.optimizer))
    zero->consolidate_state_dict(0);
  runtime::CheckpointEntry entry{dir.path_for_step(progress.step), progress.step, metric};
  std::string error;
  if (rank == 0) {
    try {
      entry = dir.save(training_checkpoint_content(parts, progress), progress.step, metric);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  // Rank 0's outcome reaches every rank, which doubles as the barrier.
  if (group && group->size() > 1) {
    Tensor failed = Tensor::from_vector<int64_t>({error.empty() ? 0 : 1}, {1});
    group->broadcast(failed, {.root = 0})->wait();
    if (rank != 0 && failed.to_vector<int64_t>()[0] != 0)
      throw Error(fmt::format("rank {}: rank 0 could not write checkpoint step {} into {}; its "
                              "error is in rank 0's output",
                              rank, progress.step, dir.path().string()));
  }
  if (!error.empty()) throw Error(error);
  return entry;
}

TrainingProgress load_training_checkpoint(const std::filesystem::path& path,
                                          const TrainingParts& parts) {
  Device device = Device::cpu();
  if (parts.model != nullptr) {
    const auto params = parts.model->parameters();
    if (!params.empty()) device = params.front().device();
  }
  const CheckpointContent content = runtime::load_checkpoint(path, {.device = device});
  return restore_training_checkpoint(content, parts, path.string());
}

}  // namespace lockstep::optim
