#include "lockstep/train/training_checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lockstep/collectives/rank_text.h"
#include "lockstep/optim/zero_redundancy_optimizer.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/checkpoint/metadata_text.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops.h"

namespace lockstep::train {

using runtime::CheckpointContent;
using runtime::NamedTensors;
using runtime::Device;
using runtime::Tensor;

namespace {

constexpr const char* kFormatKey = "training.format";
constexpr const char* kFormat = "lockstep-training-1";
constexpr std::string_view kModelPrefix = "model.";
constexpr std::string_view kStatePrefix = "optimizer.state.";
constexpr std::string_view kScalerPrefix = "grad_scaler.state.";

// Doubles as text that reads back to the same bits.
std::string number(double v) { return runtime::metadata_number(v); }

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
    const std::optional<double> v = runtime::parse_metadata_number(s);
    LOCKSTEP_CHECK(v.has_value(), "checkpoint {}: metadata \"{}\" = \"{}\" is not a number",
                   file_, key, s);
    return *v;
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

// Rank 0's generators keep the keys of files from before per-rank states.
std::string rng_key(size_t generator, size_t rank, std::string_view what) {
  return rank == 0 ? fmt::format("rng.{}.{}", generator, what)
                   : fmt::format("rng.{}.rank.{}.{}", generator, rank, what);
}

std::string group_key(size_t g, const std::string& what) {
  return fmt::format("optimizer.group.{}.{}", g, what);
}

// The update rule the optimizer's state belongs to: a ZeroRedundancyOptimizer
// keeps its inner optimizer's state, so a run may resume with or without it.
std::string update_rule(const optim::Optimizer& opt) {
  if (const auto* zero = dynamic_cast<const optim::ZeroRedundancyOptimizer*>(&opt))
    return zero->inner_name();
  return opt.name();
}

// Every parameter of `m` under every name it has there (a tied one, or one of
// a module registered twice, under each, as state_dict() lists them), the
// least of its names kept.
void least_names(const nn::Module& m, const std::string& prefix,
                 std::unordered_map<const runtime::TensorImpl*, std::string>& name_of) {
  for (const auto& [local, p] : m.named_parameters(/*recurse=*/false)) {
    auto [it, added] = name_of.emplace(p.impl_ptr(), prefix + local);
    if (!added && prefix + local < it->second) it->second = prefix + local;
  }
  for (const auto& [name, child] : m.child_list())
    least_names(*child, prefix + name + ".", name_of);
}

// The model's name of each of the optimizer's parameters, in the
// optimizer's order (its groups one after the other); empty unless every one
// has a name. A parameter of several names takes the least, so that the
// order in which the model registers them does not change it.
std::vector<std::string> optimizer_param_names(const nn::Module& model,
                                               const optim::Optimizer& opt) {
  std::unordered_map<const runtime::TensorImpl*, std::string> name_of;
  least_names(model, "", name_of);
  std::vector<std::string> names;
  for (const auto& group : opt.param_groups()) {
    for (const auto& p : group.params) {
      const auto it = name_of.find(p.impl_ptr());
      if (it == name_of.end()) return {};
      names.push_back(it->second);
    }
  }
  return names;
}

std::string param_name_key(size_t index) { return fmt::format("optimizer.param.{}.name", index); }

void add_optimizer(const nn::Module& model, const optim::Optimizer& opt, CheckpointContent& c) {
  const optim::OptimizerState state = opt.state_dict();
  const std::vector<std::string> names = optimizer_param_names(model, opt);
  for (size_t i = 0; i < names.size(); ++i) c.metadata[param_name_key(i)] = names[i];
  c.metadata["optimizer.type"] = opt.name();
  c.metadata["optimizer.rule"] = update_rule(opt);
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

// Points each of `state`'s groups at the saved parameter of the same model
// name as this optimizer's parameter in that place, so that the state of
// each parameter goes back to it by name, as the model's weights do, and not
// by position: a model that registers its layers in another order would
// otherwise get another layer's momentum or moments. A file saved without
// the names (or an optimizer over tensors the model does not hold) is read
// by position.
void match_params_by_name(optim::OptimizerState& state, const Metadata& meta,
                          const nn::Module& model, const optim::Optimizer& opt,
                          const std::string& file) {
  const std::vector<std::string> names = optimizer_param_names(model, opt);
  if (names.empty() || !meta.has(param_name_key(0))) return;
  std::unordered_map<std::string, int64_t> saved_index;
  size_t saved = 0;
  for (; meta.has(param_name_key(saved)); ++saved)
    saved_index.emplace(meta.text(param_name_key(saved)), static_cast<int64_t>(saved));
  LOCKSTEP_CHECK(saved == names.size(),
                 "checkpoint {}: the saved optimizer names {} parameter(s), this one has {}; "
                 "build the optimizer over the parameters the run was saved with",
                 file, saved, names.size());
  // Each group's options (its lr, weight decay) and its schedule are read by
  // the group's place, so each parameter must be in the group it was saved in:
  // groups of equal sizes built in another order would silently swap rates.
  std::unordered_map<int64_t, size_t> saved_group_of;
  for (size_t g = 0; g < state.param_groups.size(); ++g)
    for (int64_t index : state.param_groups[g].params) saved_group_of.emplace(index, g);
  size_t at = 0;
  for (size_t g = 0; g < state.param_groups.size(); ++g) {
    for (int64_t& index : state.param_groups[g].params) {
      const std::string& name = names[at++];
      const auto it = saved_index.find(name);
      LOCKSTEP_CHECK(it != saved_index.end(),
                     "checkpoint {}: this optimizer's parameter '{}' is not among those of the "
                     "saved optimizer; build the optimizer over the parameters the run was saved "
                     "with",
                     file, name);
      const auto saved_group = saved_group_of.find(it->second);
      LOCKSTEP_CHECK(saved_group != saved_group_of.end() && saved_group->second == g,
                     "checkpoint {}: parameter '{}' is in this optimizer's parameter group {}, "
                     "but the run saved it in group {}; a group's options (lr, weight decay) and "
                     "schedule are restored by the group's place, so it would train at another "
                     "group's rate. Build the parameter groups as the run that saved it did: the "
                     "same parameters in each, in the same order (a group added with "
                     "add_param_group, as when unfreezing, comes after those the optimizer was "
                     "built with)",
                     file, name, g,
                     saved_group == saved_group_of.end() ? std::string("(none)")
                                                         : std::to_string(saved_group->second));
      index = it->second;
    }
  }
}

optim::OptimizerState read_optimizer(const CheckpointContent& c, const Metadata& meta,
                                     const nn::Module& model, const optim::Optimizer& opt,
                                     const std::string& file) {
  const std::string saved_type = meta.text("optimizer.type");
  // Adam's state and options are AdamW's too: only the rule tells them apart.
  // A file from before the rule was saved names it unless ZeRO hid it.
  const std::string saved_rule = meta.has("optimizer.rule") ? meta.text("optimizer.rule")
                                 : saved_type == "ZeroRedundancyOptimizer" ? std::string()
                                                                           : saved_type;
  LOCKSTEP_CHECK(saved_rule.empty() || saved_rule == update_rule(opt),
                 "checkpoint {}: the run was saved with the {} optimizer, this one is {}; resume "
                 "with the optimizer the run was saved with",
                 file, saved_rule, update_rule(opt));
  const auto groups = meta.integer<size_t>("optimizer.groups");
  const auto& mine = opt.param_groups();
  LOCKSTEP_CHECK(groups == mine.size(),
                 "checkpoint {}: the saved {} optimizer has {} parameter group(s), this {} has {}; "
                 "build the optimizer as the run that saved it did",
                 file, saved_type, groups, opt.name(), mine.size());
  optim::OptimizerState state;
  for (size_t g = 0; g < groups; ++g) {
    optim::OptimizerState::Group group;
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
  match_params_by_name(state, meta, model, opt, file);
  return state;
}

// Every rank's generator states, on every rank (one all-gather; every rank
// must pass as many generators, as the header asks).
std::vector<GeneratorStates> all_generator_states(const TrainingParts& parts,
                                                  collectives::ProcessGroup& group) {
  const GeneratorStates mine = generator_states(parts);
  if (group.size() == 1) return {mine};
  // Bit patterns through int64: seeds use all 64 bits.
  std::vector<int64_t> flat;
  for (const auto& [seed, offset] : mine) {
    flat.push_back(static_cast<int64_t>(seed));
    flat.push_back(static_cast<int64_t>(offset));
  }
  const auto width = static_cast<int64_t>(flat.size());
  Tensor in = Tensor::from_vector(flat, {width});
  Tensor out = Tensor::zeros({width * group.size()}, runtime::DType::i64);
  group.allgather(out, in)->wait();
  const auto values = out.to_vector<int64_t>();
  std::vector<GeneratorStates> all(static_cast<size_t>(group.size()));
  for (size_t r = 0; r < all.size(); ++r) {
    for (size_t i = 0; i < mine.size(); ++i) {
      const size_t at = r * flat.size() + 2 * i;
      all[r].emplace_back(static_cast<uint64_t>(values[at]), static_cast<uint64_t>(values[at + 1]));
    }
  }
  return all;
}

// The names of the model's parameters that hold NaN or infinity: x * 0 sums
// to a finite 0 only when every x is finite (one pass on any device).
std::vector<std::string> non_finite_parameters(const nn::Module& model) {
  runtime::NoGradGuard no_grad;
  std::vector<std::string> bad;
  for (const auto& [name, p] : model.named_parameters())
    if (!std::isfinite(runtime::sum(runtime::mul(p, 0.0)).item())) bad.push_back(name);
  return bad;
}

// A diverged run's parameters are not written: its newest checkpoint stays
// the last good one, and keep_last does not rotate good ones out for it.
void check_parameters_finite(const nn::Module& model, int64_t step) {
  const std::vector<std::string> bad = non_finite_parameters(model);
  if (bad.empty()) return;
  const size_t shown = std::min<size_t>(bad.size(), 3);
  throw Error(fmt::format(
      "not saving checkpoint step {}: {} of the model's parameters hold NaN or infinity ({}{}): "
      "training has diverged; the checkpoints already saved are kept. Resume from the newest "
      "with a lower learning rate or with gradient clipping",
      step, bad.size(), fmt::join(bad.begin(), bad.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
      bad.size() > shown ? ", ..." : ""));
}

// A scheduler left from before a new optimizer was made (when unfreezing a
// backbone) goes on setting the old one's rates: the new one would train at
// a constant rate and be saved with another optimizer's schedule.
void check_scheduler_drives_optimizer(const TrainingParts& parts, std::string_view what) {
  LOCKSTEP_CHECK(parts.scheduler == nullptr || parts.optimizer == nullptr ||
                     parts.scheduler->drives(*parts.optimizer),
                 "{}: TrainingParts::scheduler ({}) was made for another optimizer than "
                 "TrainingParts::optimizer ({}), so it does not set that optimizer's rates. "
                 "After making a new optimizer (as when unfreezing part of a model), make a "
                 "scheduler for it and pass both",
                 what, parts.scheduler->name(), parts.optimizer->name());
}

}  // namespace

GeneratorStates generator_states(const TrainingParts& parts) {
  GeneratorStates states;
  for (const runtime::Generator* g : parts.generators) states.emplace_back(g->seed(), g->offset());
  return states;
}

CheckpointContent training_checkpoint_content(const TrainingParts& parts,
                                              const TrainingProgress& progress,
                                              const std::vector<GeneratorStates>& ranks) {
  LOCKSTEP_CHECK(parts.model != nullptr, "save_training_checkpoint: TrainingParts has no model");
  check_scheduler_drives_optimizer(parts, "save_training_checkpoint");
  CheckpointContent c;
  c.metadata[kFormatKey] = kFormat;
  for (const auto& [name, tensor] : parts.model->state_dict())
    c.tensors.emplace_back(std::string(kModelPrefix) + name, tensor);
  if (parts.optimizer) add_optimizer(*parts.model, *parts.optimizer, c);
  if (parts.scheduler) {
    c.metadata["scheduler.type"] = parts.scheduler->name();
    for (const auto& [key, value] : parts.scheduler->state_dict())
      c.metadata["scheduler.state." + key] = number(value);
  }
  if (parts.scaler)
    for (const auto& [key, value] : parts.scaler->state_dict())
      c.metadata[std::string(kScalerPrefix) + key] = number(value);
  const std::vector<GeneratorStates> all =
      ranks.empty() ? std::vector<GeneratorStates>{generator_states(parts)} : ranks;
  c.metadata["rng.count"] = std::to_string(parts.generators.size());
  c.metadata["rng.ranks"] = std::to_string(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    LOCKSTEP_CHECK(all[r].size() == parts.generators.size(),
                   "save_training_checkpoint: rank {} has {} random generator(s) to save, rank 0 "
                   "has {}; give every rank the same TrainingParts::generators",
                   r, all[r].size(), parts.generators.size());
    for (size_t i = 0; i < all[r].size(); ++i) {
      c.metadata[rng_key(i, r, "seed")] = std::to_string(all[r][i].first);
      c.metadata[rng_key(i, r, "offset")] = std::to_string(all[r][i].second);
    }
  }
  c.metadata["training.epoch"] = std::to_string(progress.epoch);
  c.metadata["training.batch"] = std::to_string(progress.batch);
  c.metadata["training.step"] = std::to_string(progress.step);
  if (progress.best_metric) c.metadata["training.best_metric"] = number(*progress.best_metric);
  for (const auto& [key, value] : progress.user) c.metadata["user." + key] = value;
  return c;
}

TrainingProgress restore_training_checkpoint(const CheckpointContent& c, const TrainingParts& parts,
                                             const std::string& file, int rank, int world,
                                             const RestoreOptions& options) {
  LOCKSTEP_CHECK(parts.model != nullptr, "load_training_checkpoint: TrainingParts has no model");
  check_scheduler_drives_optimizer(parts, "load_training_checkpoint");
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
  // The model's own checks go further (two values for one tied weight).
  const nn::StateDict model_state(std::move(model_tensors));
  try {
    parts.model->check_state_dict(model_state);
  } catch (const Error& e) {
    throw Error(fmt::format("checkpoint {}: {}", file, e.what()));
  }

  std::optional<optim::OptimizerState> opt_state;
  if (parts.optimizer) {
    LOCKSTEP_CHECK(meta.has("optimizer.type"),
                   "checkpoint {}: holds no optimizer state, but an optimizer was given to "
                   "restore; leave TrainingParts::optimizer null to load the model only",
                   file);
    opt_state = read_optimizer(c, meta, *parts.model, *parts.optimizer, file);
    if (options.lr) {
      std::vector<double> saved_lrs;
      for (size_t g = 0; g < opt_state->param_groups.size(); ++g) {
        auto& group_options = opt_state->param_groups[g].options;
        LOCKSTEP_CHECK(group_options.contains("lr"),
                       "checkpoint {}: parameter group {} of the saved {} optimizer has no "
                       "learning rate to replace",
                       file, g, meta.text("optimizer.type"));
        saved_lrs.push_back(group_options["lr"]);
        group_options["lr"] = *options.lr;
      }
      // One rate for groups that trained at different ones (a backbone
      // below its head, layer-wise decay) would flatten them silently.
      LOCKSTEP_CHECK(std::adjacent_find(saved_lrs.begin(), saved_lrs.end(),
                                        std::not_equal_to<>()) == saved_lrs.end(),
                     "checkpoint {}: a new learning rate ({}) was asked for, but the saved "
                     "parameter groups train at different rates ({}); one rate for all of them "
                     "would undo their differences. Resume with the saved rates, then set each "
                     "group's \"lr\" (and, with a scheduler, its base rates through its "
                     "state_dict) yourself",
                     file, *options.lr, fmt::join(saved_lrs, ", "));
    }
  }
  optim::SchedulerState sched_state;
  if (parts.scheduler) {
    const std::string saved = meta.has("scheduler.type") ? meta.text("scheduler.type") : "none";
    LOCKSTEP_CHECK(saved == parts.scheduler->name(),
                   "checkpoint {}: the run was saved with LR scheduler {}, this one is {}; resume "
                   "with the schedule the run was saved with",
                   file, saved, parts.scheduler->name());
    for (const auto& [key, text] : meta.under("scheduler.state."))
      sched_state[key] = meta.real("scheduler.state." + key);
    // The schedule goes on from the new rate: its value at the saved
    // position, computed from the new base. A schedule whose rates do not
    // follow its base rates would overwrite the new rate at once.
    LOCKSTEP_CHECK(!options.lr || parts.scheduler->follows_base_lrs(),
                   "checkpoint {}: a new learning rate ({}) was asked for, but {}'s rates do "
                   "not follow the optimizer's (they come from its own settings, e.g. max_lr), "
                   "so it would be ignored; resume with the learning rate the run was saved with",
                   file, options.lr.value_or(0.0), parts.scheduler->name());
    if (options.lr) {
      std::vector<double> saved_bases;
      for (auto& [key, value] : sched_state) {
        if (!key.starts_with("base_lr.")) continue;
        saved_bases.push_back(value);
        value = *options.lr;
      }
      // The groups' rates may meet where the schedule has shrunk them all to
      // its floor; their bases still differ.
      LOCKSTEP_CHECK(std::adjacent_find(saved_bases.begin(), saved_bases.end(),
                                        std::not_equal_to<>()) == saved_bases.end(),
                     "checkpoint {}: a new learning rate ({}) was asked for, but {}'s saved "
                     "base rates differ between parameter groups ({}); one rate for all of them "
                     "would undo their differences. Resume with the saved rates, then set the "
                     "base rates through the scheduler's state_dict yourself",
                     file, *options.lr, parts.scheduler->name(), fmt::join(saved_bases, ", "));
    }
    try {
      parts.scheduler->check_state_dict(sched_state);
    } catch (const Error& e) {
      throw Error(fmt::format("checkpoint {}: {}", file, e.what()));
    }
  }
  // The reverse: without its scheduler the optimizer would go on at the
  // last scheduled rate for the rest of the run.
  LOCKSTEP_CHECK(parts.scheduler != nullptr || parts.optimizer == nullptr ||
                     !meta.has("scheduler.type"),
                 "checkpoint {}: the run was saved with LR scheduler {}, but none was given to "
                 "restore, so the optimizer would stay at the rate the schedule last set; pass "
                 "it as TrainingParts::scheduler, built with the run's settings (or leave "
                 "TrainingParts::optimizer null to load the model only)",
                 file, meta.has("scheduler.type") ? meta.text("scheduler.type") : "");
  optim::GradScalerState scaler_state;
  if (parts.scaler && parts.scaler->is_enabled()) {
    for (const auto& [key, text] : meta.under(std::string(kScalerPrefix)))
      scaler_state[key] = meta.real(std::string(kScalerPrefix) + key);
    LOCKSTEP_CHECK(!scaler_state.empty(),
                   "checkpoint {}: holds no GradScaler state, but an enabled GradScaler was "
                   "given to restore; resume with the loss scaling the run was saved with",
                   file);
    try {
      parts.scaler->check_state_dict(scaler_state);
    } catch (const Error& e) {
      throw Error(fmt::format("checkpoint {}: {}", file, e.what()));
    }
  }
  const auto rng_count = meta.integer<size_t>("rng.count");
  LOCKSTEP_CHECK(rng_count == parts.generators.size(),
                 "checkpoint {}: holds {} random generator state(s), {} were given to restore",
                 file, rng_count, parts.generators.size());
  const auto saved_ranks = meta.has("rng.ranks") ? meta.integer<size_t>("rng.ranks") : size_t{1};
  const size_t from =
      saved_ranks == static_cast<size_t>(world) ? static_cast<size_t>(rank) : size_t{0};
  GeneratorStates rng;
  for (size_t i = 0; i < rng_count; ++i)
    rng.emplace_back(meta.integer<uint64_t>(rng_key(i, from, "seed")),
                     meta.integer<uint64_t>(rng_key(i, from, "offset")));
  TrainingProgress progress{.epoch = meta.integer<int64_t>("training.epoch"),
                            .batch = meta.integer<int64_t>("training.batch"),
                            .step = meta.integer<int64_t>("training.step")};
  if (meta.has("training.best_metric")) progress.best_metric = meta.real("training.best_metric");
  progress.user = meta.under("user.");

  // The optimizer's own checks (state shapes against its parameters) run
  // inside its load_state_dict, which changes nothing when it throws: first.
  if (parts.optimizer) {
    try {
      parts.optimizer->load_state_dict(*opt_state);
    } catch (const Error& e) {
      throw Error(fmt::format("checkpoint {}: {}", file, e.what()));
    }
  }
  parts.model->load_state_dict(model_state);
  if (parts.scheduler) parts.scheduler->load_state_dict(sched_state);
  if (parts.scaler) parts.scaler->load_state_dict(scaler_state);
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
                                                  collectives::ProcessGroup& group) {
  const int rank = group.rank();
  check_same_directory(dir.path(), group, "save_training_checkpoint");
  if (auto* zero = dynamic_cast<optim::ZeroRedundancyOptimizer*>(parts.optimizer))
    zero->consolidate_state_dict(0);
  const std::vector<GeneratorStates> generators = all_generator_states(parts, group);
  runtime::CheckpointEntry entry{dir.path_for_step(progress.step), progress.step, metric};
  std::string error;
  if (rank == 0) {
    try {
      check_parameters_finite(*parts.model, progress.step);
      entry = dir.save(training_checkpoint_content(parts, progress, generators), progress.step,
                       metric);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  // Rank 0's outcome reaches every rank, which doubles as the barrier; the
  // reason travels too, as the first rank to stop may be the one heard.
  error = collectives::broadcast_text(error, group);
  if (rank != 0 && !error.empty())
    throw Error(fmt::format("rank {}: rank 0 could not write checkpoint step {} into {}: {}", rank,
                            progress.step, dir.path().string(), error));
  if (!error.empty()) throw Error(error);
  return entry;
}

std::optional<runtime::CheckpointEntry> latest_training_checkpoint(
    const runtime::CheckpointDir& dir, collectives::ProcessGroup& group) {
  check_same_directory(dir.path(), group, "latest_training_checkpoint");
  const int rank = group.rank();
  std::optional<runtime::CheckpointEntry> chosen;
  if (rank == 0) chosen = dir.latest();
  if (group.size() == 1) return chosen;
  // Rank 0's choice: {step, or -1 for none; whether it has a metric; the metric}.
  Tensor pick = Tensor::from_vector<double>(
      {chosen ? static_cast<double>(chosen->step) : -1.0, chosen && chosen->metric ? 1.0 : 0.0,
       chosen && chosen->metric ? *chosen->metric : 0.0},
      {3});
  group.broadcast(pick, {.root = 0})->wait();
  const auto p = pick.to_vector<double>();
  if (p[0] < 0) return std::nullopt;
  if (rank != 0) {
    chosen = runtime::CheckpointEntry{.path = dir.path_for_step(static_cast<int64_t>(p[0])),
                                      .step = static_cast<int64_t>(p[0])};
    if (p[1] != 0) chosen->metric = p[2];
  }
  check_every_rank_sees(chosen->path, group);
  return chosen;
}

void check_same_directory(const std::filesystem::path& dir, collectives::ProcessGroup& group,
                          const std::string& caller) {
  if (group.size() == 1) return;
  const std::vector<std::string> dirs = collectives::allgather_text(dir.string(), group);
  const bool same =
      std::all_of(dirs.begin(), dirs.end(), [&](const std::string& d) { return d == dirs[0]; });
  if (same) return;
  std::string listed;
  for (size_t r = 0; r < dirs.size(); ++r)
    listed += fmt::format("{}rank {}: {}", r == 0 ? "" : ", ", r, dirs[r]);
  throw Error(fmt::format(
      "{} on rank {} of group '{}': its ranks name different checkpoint directories ({}), but "
      "the group's rank 0 decides and writes for all of them, so the others would save nothing "
      "and resume from rank 0's choice; pass each model's own group (the one from new_group() "
      "that its DDP and optimizer use) with its directory",
      caller, group.rank(), group.name(), listed));
}

void check_every_rank_sees(const std::filesystem::path& path, collectives::ProcessGroup& group) {
  if (group.size() == 1) return;
  const int rank = group.rank();
  std::error_code ec;
  const int32_t visible = std::filesystem::is_regular_file(path, ec) ? 1 : 0;
  Tensor sees = Tensor::from_vector<int32_t>({visible}, {1});
  Tensor all = Tensor::zeros({group.size()}, runtime::DType::i32);
  group.allgather(all, sees)->wait();
  std::vector<int> blind;
  const auto seen = all.to_vector<int32_t>();
  for (int r = 0; r < group.size(); ++r)
    if (seen[static_cast<size_t>(r)] == 0) blind.push_back(r);
  LOCKSTEP_CHECK(blind.empty(),
                 "resume on rank {}: rank 0 picked checkpoint {}, which rank(s) {} cannot see; "
                 "put the checkpoint directory where every rank reads the same files (a shared "
                 "file system on several nodes)",
                 rank, path.string(), fmt::join(blind, ", "));
}

TrainingProgress load_training_checkpoint(const std::filesystem::path& path,
                                          const TrainingParts& parts,
                                          collectives::ProcessGroup& group,
                                          const RestoreOptions& options) {
  Device device = Device::cpu();
  if (parts.model != nullptr) {
    const auto params = parts.model->parameters();
    if (!params.empty()) device = params.front().device();
  }
  const CheckpointContent content = runtime::load_checkpoint(path, {.device = device});
  return restore_training_checkpoint(content, parts, path.string(), group.rank(),
                                     group.size(), options);
}

}  // namespace lockstep::train
