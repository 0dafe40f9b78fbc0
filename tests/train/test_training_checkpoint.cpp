// Training checkpoints in one process (and two rank threads): what is saved
// comes back, a mismatched model or optimizer is refused before anything
// changes, and a failed write on rank 0 fails every rank. The end-to-end
// resume (bit-identical training) is in test_exact_resume.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "collectives/rank_threads.h"
#include "lockstep/models/models.h"
#include "lockstep/nn/container.h"
#include "lockstep/nn/ddp/distributed_data_parallel.h"
#include "lockstep/nn/linear.h"
#include "lockstep/optim/adam.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/optim/zero_redundancy_optimizer.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/train/training_checkpoint.h"
#include "support/backend_skip.h"
#include "support/test_util.h"

using namespace lockstep;
using namespace lockstep::optim;
using namespace lockstep::train;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("lockstep-tc-{}-{}", name, getpid());
  fs::remove_all(dir);
  return dir;
}

// One Adam step on random data, so the optimizer has state.
void train_step(nn::Module& model, Optimizer& opt) {
  Tensor x = runtime::randn({8, 1, 28, 28});
  Tensor y = Tensor::from_vector<int64_t>({0, 1, 2, 3, 4, 5, 6, 7}, {8});
  Tensor loss = runtime::cross_entropy(model(x), y);
  opt.zero_grad();
  loss.backward();
  opt.step();
}

// Compared inside CHECK((a == b)): a failing vector comparison would print
// every element.
std::vector<float> flat_parameters(const nn::Module& model) {
  std::vector<float> out;
  for (const auto& [name, t] : model.state_dict()) {
    if (t.dtype() != runtime::DType::f32) continue;
    auto v = t.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace

TEST_CASE("A training checkpoint restores model, optimizer, schedule, RNG and progress",
          "[optim][checkpoint]") {
  const fs::path dir = scratch("roundtrip");
  auto model = models::fashion_cnn(1);
  Adam opt(model->parameters(), {.lr = 1e-3});
  StepLR sched(opt, {.step_size = 2, .gamma = 0.5});
  for (int i = 0; i < 3; ++i) {
    train_step(*model, opt);
    sched.step();
  }
  runtime::CheckpointDir ckpt(dir, {.keep_last = 1});
  TrainingParts parts{.model = model.get(), .optimizer = &opt, .scheduler = &sched};
  const TrainingProgress saved{.epoch = 2, .batch = 7, .step = 3, .best_metric = 0.75,
                               .user = {{"note", "hello"}}};
  const auto entry = save_training_checkpoint(ckpt, parts, saved, 0.75, testing::one_rank_group());
  CHECK(entry.step == 3);
  const uint64_t rng_offset = runtime::default_generator().offset();

  // A second model, optimizer and schedule, trained differently, take it all.
  auto other = models::fashion_cnn(2);
  Adam other_opt(other->parameters(), {.lr = 1e-3});
  StepLR other_sched(other_opt, {.step_size = 2, .gamma = 0.5});
  train_step(*other, other_opt);
  (void)runtime::randn({100});  // move the default generator on
  TrainingParts other_parts{.model = other.get(), .optimizer = &other_opt, .scheduler = &other_sched};
  const TrainingProgress back = load_training_checkpoint(entry.path, other_parts, testing::one_rank_group());
  CHECK(back.epoch == 2);
  CHECK(back.batch == 7);
  CHECK(back.step == 3);
  CHECK(back.best_metric == 0.75);
  CHECK(back.user == std::map<std::string, std::string>{{"note", "hello"}});
  CHECK(runtime::default_generator().offset() == rng_offset);
  CHECK((flat_parameters(*other) == flat_parameters(*model)));
  CHECK(other_sched.last_epoch() == sched.last_epoch());
  CHECK(other_opt.param_groups()[0].options == opt.param_groups()[0].options);

  // From here both continue identically.
  const auto seed_state = runtime::default_generator().offset();
  train_step(*model, opt);
  runtime::default_generator().set_offset(seed_state);
  train_step(*other, other_opt);
  CHECK((flat_parameters(*other) == flat_parameters(*model)));
  fs::remove_all(dir);
}

TEST_CASE("Loading a training checkpoint into another model or optimizer changes nothing",
          "[optim][checkpoint]") {
  const fs::path dir = scratch("mismatch");
  auto model = models::fashion_mlp(1);
  Adam opt(model->parameters(), {});
  train_step(*model, opt);
  runtime::CheckpointDir ckpt(dir);
  const auto entry =
      save_training_checkpoint(ckpt, {.model = model.get(), .optimizer = &opt}, {.step = 1},
                               std::nullopt, testing::one_rank_group());

  SECTION("another model") {
    auto cnn = models::fashion_cnn(1);
    const auto before = flat_parameters(*cnn);
    CHECK_THROWS_WITH(load_training_checkpoint(entry.path, {.model = cnn.get()}, testing::one_rank_group()),
                      Contains(entry.path.string()));
    CHECK((flat_parameters(*cnn) == before));
  }
  SECTION("another optimizer") {
    auto same = models::fashion_mlp(2);
    const auto before = flat_parameters(*same);
    SGD sgd(same->parameters(), {.lr = 0.1, .momentum = 0.9});
    CHECK_THROWS_WITH(load_training_checkpoint(entry.path, {.model = same.get(), .optimizer = &sgd}, testing::one_rank_group()),
                      Contains("saved with the Adam optimizer, this one is SGD"));
    CHECK((flat_parameters(*same) == before));
  }
  SECTION("AdamW where the run had Adam") {
    // The same options and state names: only the type tells them apart.
    auto same = models::fashion_mlp(2);
    const auto before = flat_parameters(*same);
    AdamW adamw(same->parameters(), {});
    CHECK_THROWS_WITH(
        load_training_checkpoint(entry.path, {.model = same.get(), .optimizer = &adamw},
                                 testing::one_rank_group()),
        Contains("saved with the Adam optimizer, this one is AdamW"));
    CHECK((flat_parameters(*same) == before));
  }
  SECTION("the same update rule with ZeRO, but not another") {
    // ZeRO keeps the plain optimizer's state: a run may resume with or without it.
    auto same = models::fashion_mlp(2);
    const auto factory = [](bool decoupled) -> OptimizerFactory {
      return [decoupled](std::vector<ParamGroup> g) -> std::unique_ptr<Optimizer> {
        if (decoupled) return std::make_unique<AdamW>(std::move(g), AdamWOptions{});
        return std::make_unique<Adam>(std::move(g), AdamOptions{});
      };
    };
    ZeroRedundancyOptimizer adam(same->parameters(), testing::one_rank_group_ptr(), factory(false));
    load_training_checkpoint(entry.path, {.model = same.get(), .optimizer = &adam},
                             testing::one_rank_group());
    ZeroRedundancyOptimizer adamw(same->parameters(), testing::one_rank_group_ptr(), factory(true));
    CHECK_THROWS_WITH(
        load_training_checkpoint(entry.path, {.model = same.get(), .optimizer = &adamw},
                                 testing::one_rank_group()),
        Contains("saved with the Adam optimizer, this one is AdamW"));
  }
  SECTION("a scheduler the run did not have") {
    auto same = models::fashion_mlp(2);
    Adam adam(same->parameters(), {});
    CosineLR sched(adam, {.t_max = 10});
    const auto before = flat_parameters(*same);
    CHECK_THROWS_WITH(load_training_checkpoint(
                          entry.path, {.model = same.get(), .optimizer = &adam, .scheduler = &sched},
                          testing::one_rank_group()),
                      Contains("saved with LR scheduler none, this one is CosineLR"));
    CHECK((flat_parameters(*same) == before));
  }
  SECTION("optimizer state that does not fit the parameters") {
    // The same layout but a transposed first weight: names and groups match,
    // the Adam moments' shapes do not; the optimizer refuses, the model is untouched.
    auto content = training_checkpoint_content({.model = model.get(), .optimizer = &opt}, {.step = 1});
    for (auto& [name, t] : content.tensors)
      if (name.starts_with("optimizer.state.0.") && t.dim() == 2) t = t.transpose(0, 1).contiguous();
    auto same = models::fashion_mlp(2);
    Adam adam(same->parameters(), {});
    const auto before = flat_parameters(*same);
    CHECK_THROWS_WITH(restore_training_checkpoint(content, {.model = same.get(), .optimizer = &adam},
                                                  "edited.safetensors"),
                      Contains("edited.safetensors") && Contains("has shape"));
    CHECK((flat_parameters(*same) == before));
  }
  SECTION("a model that refuses the file after the names and shapes matched") {
    // GPT ties lm_head.weight to transformer.wte.weight: a file holding two
    // values for them passes the name and shape checks, and the model's own
    // load refuses it. The optimizer must not have taken the file's state.
    const models::GptConfig config{.vocab_size = 11, .block_size = 4, .n_layer = 1,
                                   .n_head = 1, .n_embd = 4};
    auto gpt = models::gpt(config, 1);
    Adam gpt_opt(gpt->parameters(), {.lr = 1e-3});
    Tensor idx = Tensor::from_vector<int64_t>({1, 2, 3, 4}, {1, 4});
    runtime::sum((*gpt)(idx)).backward();
    gpt_opt.step();
    auto content = training_checkpoint_content({.model = gpt.get(), .optimizer = &gpt_opt},
                                               {.step = 1});
    for (auto& [name, t] : content.tensors)
      if (name == "model.lm_head.weight") t = runtime::add(t, 1.0);
    auto fresh = models::gpt(config, 2);
    Adam fresh_opt(fresh->parameters(), {.lr = 5e-4});
    const auto before = flat_parameters(*fresh);
    CHECK_THROWS_WITH(
        restore_training_checkpoint(content, {.model = fresh.get(), .optimizer = &fresh_opt},
                                    "edited.safetensors"),
        Contains("edited.safetensors") && Contains("tied"));
    CHECK((flat_parameters(*fresh) == before));
    CHECK(fresh_opt.param_groups()[0].options.at("lr") == 5e-4);
    CHECK(fresh_opt.state_dict().state.empty());
  }
  SECTION("the same model saved from inside a DDP wrapper, and loaded into one") {
    // Said as such, not as "a different model or configuration".
    auto wrapped = std::make_shared<nn::DistributedDataParallel>(models::fashion_mlp(1),
                                                                 testing::one_rank_group_ptr());
    const auto from_wrapper =
        save_training_checkpoint(ckpt, {.model = wrapped.get()}, {.step = 2}, std::nullopt,
                                 testing::one_rank_group());
    auto bare = models::fashion_mlp(2);
    const auto before = flat_parameters(*bare);
    const std::string into_bare = testing::error_of(
        [&] { load_training_checkpoint(from_wrapper.path, {.model = bare.get()},
                                       testing::one_rank_group()); });
    CHECK_THAT(into_bare, Contains("saved from a model wrapped in DistributedDataParallel") &&
                              !Contains("different model"));
    CHECK((flat_parameters(*bare) == before));
    CHECK_THAT(testing::error_of([&] {
                 load_training_checkpoint(entry.path, {.model = wrapped.get()},
                                          testing::one_rank_group());
               }),
               Contains("saved from the bare model: load it into the wrapper's module()"));
    // Another name in front (the model held in a container, say).
    auto outer = std::make_shared<nn::Sequential>();
    outer->push_back(models::fashion_mlp(3));
    CHECK_THAT(testing::error_of([&] {
                 load_training_checkpoint(entry.path, {.model = outer.get()},
                                          testing::one_rank_group());
               }),
               Contains("The expected names are the file's ones with \"0.\" in front"));
  }
  SECTION("a plain weights file is not a training checkpoint") {
    const fs::path plain = dir / "weights.safetensors";
    runtime::save_checkpoint(plain, {.tensors = model->state_dict().items(), .metadata = {}});
    CHECK_THROWS_WITH(load_training_checkpoint(plain, {.model = model.get()}, testing::one_rank_group()),
                      Contains("not a lockstep training checkpoint"));
  }
  fs::remove_all(dir);
}

TEST_CASE("A checkpoint rank 0 cannot write fails every rank", "[optim][checkpoint]") {
  const fs::path dir = scratch("unwritable");
  auto groups = testing::make_groups(testing::kThreadRankBackend, 2, "ckpt-fail");
  std::vector<std::string> messages(2);
  const auto errors = testing::run_ranks(2, [&](int r) {
    auto model = models::fashion_mlp(1);
    // Only rank 0 writes; the others open the directory read-only, as
    // open_training_run does.
    runtime::CheckpointDir ckpt(dir, {.read_only = r != 0});
    // Rank 0's directory disappears and a file takes its place.
    if (r == 0) {
      fs::remove_all(ckpt.path());
      std::ofstream(ckpt.path()) << "not a directory";
    }
    save_training_checkpoint(ckpt, {.model = model.get()}, {.step = 5}, std::nullopt,
                             *groups[static_cast<size_t>(r)]);
  });
  REQUIRE(errors[0]);
  REQUIRE(errors[1]);
  CHECK_THAT(testing::message_of(errors[1]), Contains("rank 0 could not write checkpoint step 5"));
  fs::remove_all(dir);
}

TEST_CASE("A diverged model is not saved: every rank throws and the newest checkpoint stays good",
          "[optim][checkpoint]") {
  const fs::path dir = scratch("diverged");
  auto groups = testing::make_groups(testing::kThreadRankBackend, 2, "ckpt-nan");
  const auto errors = testing::run_ranks(2, [&](int r) {
    auto& group = *groups[static_cast<size_t>(r)];
    auto model = models::fashion_mlp(1);
    runtime::CheckpointDir ckpt(dir, {.keep_last = 1, .read_only = r != 0});
    save_training_checkpoint(ckpt, {.model = model.get()}, {.step = 1}, std::nullopt, group);
    const double bad = r == 0 ? std::nan("") : INFINITY;  // both kinds, one per rank's model
    for (const auto& [name, p] : model->named_parameters()) {
      if (name != "1.bias" && name != "3.weight") continue;
      runtime::NoGradGuard no_grad;
      p.view({-1}).slice(0, 3, 4).fill_(bad);
    }
    save_training_checkpoint(ckpt, {.model = model.get()}, {.step = 2}, std::nullopt, group);
  });
  REQUIRE(errors[0]);
  REQUIRE(errors[1]);
  CHECK_THAT(testing::message_of(errors[0]),
             Contains("not saving checkpoint step 2: 2 of the model's parameters hold NaN or "
                      "infinity (1.bias, 3.weight)") &&
                 Contains("the checkpoints already saved are kept"));
  CHECK_THAT(testing::message_of(errors[1]), Contains("rank 0 could not write checkpoint step 2"));
  // keep_last 1 did not rotate step 1 out for the diverged step 2.
  const auto latest = runtime::CheckpointDir(dir).latest();
  REQUIRE(latest);
  CHECK(latest->step == 1);
  CHECK_FALSE(fs::exists(runtime::CheckpointDir(dir).path_for_step(2)));
  fs::remove_all(dir);
}

TEST_CASE("A schedule saved with other settings is refused before anything changes",
          "[optim][checkpoint]") {
  const fs::path dir = scratch("schedule");
  auto model = models::fashion_mlp(1);
  SGD opt(model->parameters(), {.lr = 0.1});
  CosineLR sched(opt, {.t_max = 100});
  runtime::CheckpointDir ckpt(dir);
  const auto entry = save_training_checkpoint(
      ckpt, {.model = model.get(), .optimizer = &opt, .scheduler = &sched}, {.step = 1},
      std::nullopt, testing::one_rank_group());

  auto other = models::fashion_mlp(2);
  SGD other_opt(other->parameters(), {.lr = 0.1});
  CosineLR longer(other_opt, {.t_max = 150});  // e.g. resumed with more --epochs
  const auto before = flat_parameters(*other);
  CHECK_THROWS_WITH(
      load_training_checkpoint(entry.path,
                               {.model = other.get(), .optimizer = &other_opt, .scheduler = &longer},
                               testing::one_rank_group()),
      Contains(entry.path.string()) && Contains("t_max = 100, this one has 150"));
  CHECK((flat_parameters(*other) == before));
  fs::remove_all(dir);
}

TEST_CASE("A run saved with a schedule is not resumed without it", "[optim][checkpoint]") {
  const fs::path dir = scratch("no-schedule");
  auto model = models::fashion_mlp(1);
  SGD opt(model->parameters(), {.lr = 0.1});
  CosineLR sched(opt, {.t_max = 100});
  for (int i = 0; i < 40; ++i) sched.step();
  runtime::CheckpointDir ckpt(dir);
  const auto entry = save_training_checkpoint(
      ckpt, {.model = model.get(), .optimizer = &opt, .scheduler = &sched}, {.step = 40},
      std::nullopt, testing::one_rank_group());

  // Without its scheduler the optimizer would keep step 40's rate for good.
  auto other = models::fashion_mlp(2);
  SGD other_opt(other->parameters(), {.lr = 0.1});
  const auto before = flat_parameters(*other);
  CHECK_THROWS_WITH(
      load_training_checkpoint(entry.path, {.model = other.get(), .optimizer = &other_opt},
                               testing::one_rank_group()),
      Contains(entry.path.string()) && Contains("saved with LR scheduler CosineLR") &&
          Contains("TrainingParts::scheduler"));
  CHECK((flat_parameters(*other) == before));
  CHECK(other_opt.param_groups()[0].options.at("lr") == 0.1);

  // The model alone needs no scheduler.
  load_training_checkpoint(entry.path, {.model = other.get()}, testing::one_rank_group());
  CHECK((flat_parameters(*other) == flat_parameters(*model)));
  fs::remove_all(dir);
}

TEST_CASE("Every rank's generators are saved, and each rank gets its own back",
          "[optim][checkpoint]") {
  const fs::path dir = scratch("rng-ranks");
  auto groups = testing::make_groups(testing::kThreadRankBackend, 2, "ckpt-rng");
  std::vector<std::pair<uint64_t, uint64_t>> saved(2), restored(2), other_world(2);
  std::vector<std::optional<int64_t>> picked(2);
  const auto errors = testing::run_ranks(2, [&](int r) {
    auto& group = *groups[static_cast<size_t>(r)];
    auto model = models::fashion_mlp(1);
    runtime::Generator gen(100 + static_cast<uint64_t>(r));
    for (int i = 0; i < 10 * (r + 1); ++i) (void)gen.next_u32();  // ranks drew differently
    saved[static_cast<size_t>(r)] = {gen.seed(), gen.offset()};
    const TrainingParts parts{.model = model.get(), .generators = {&gen}};
    runtime::CheckpointDir ckpt(dir);  // one directory that both ranks see
    save_training_checkpoint(ckpt, parts, {.step = 3}, std::nullopt, group);

    gen.manual_seed(7);
    auto last = latest_training_checkpoint(ckpt, group);
    if (last) picked[static_cast<size_t>(r)] = last->step;
    load_training_checkpoint(last->path, parts, group);
    restored[static_cast<size_t>(r)] = {gen.seed(), gen.offset()};
    // Resumed on one rank: rank 0's states.
    load_training_checkpoint(last->path, parts, testing::one_rank_group());
    other_world[static_cast<size_t>(r)] = {gen.seed(), gen.offset()};
  });
  REQUIRE_FALSE(errors[0]);
  REQUIRE_FALSE(errors[1]);
  CHECK(saved[0] != saved[1]);
  CHECK(restored == saved);
  CHECK(other_world[0] == saved[0]);
  CHECK(other_world[1] == saved[0]);
  CHECK(picked[0] == 3);
  CHECK(picked[1] == 3);
  fs::remove_all(dir);
}

TEST_CASE("A checkpoint some rank cannot see stops every rank, naming it", "[optim][checkpoint]") {
  const fs::path dir = scratch("unseen");
  auto groups = testing::make_groups(testing::kThreadRankBackend, 2, "ckpt-unseen");
  auto model = models::fashion_mlp(1);
  {
    runtime::CheckpointDir ckpt(dir / "0");
    save_training_checkpoint(ckpt, {.model = model.get()}, {.step = 4}, std::nullopt, testing::one_rank_group());
  }
  const auto errors = testing::run_ranks(2, [&](int r) {
    // Each rank looks in its own directory, as a node without the shared file
    // system would: rank 1's is empty. (latest_training_checkpoint refuses
    // two directory names before it gets here, so the check is called alone.)
    check_every_rank_sees(runtime::CheckpointDir(dir / std::to_string(r)).path_for_step(4),
                          *groups[static_cast<size_t>(r)]);
  });
  REQUIRE(errors[0]);
  REQUIRE(errors[1]);
  CHECK_THAT(testing::message_of(errors[0]), Contains("which rank(s) 1 cannot see"));
  CHECK_THAT(testing::message_of(errors[1]), Contains("which rank(s) 1 cannot see"));
  fs::remove_all(dir);
}

namespace {

// Two Linear(3, 3) layers "a" then "b", registered in that order or the
// other: the same state_dict names, the parameters in another order.
struct TwoLayers : nn::Module {
  explicit TwoLayers(bool a_first) {
    if (a_first) {
      a = register_module("a", std::make_shared<nn::Linear>(3, 3));
      b = register_module("b", std::make_shared<nn::Linear>(3, 3));
    } else {
      b = register_module("b", std::make_shared<nn::Linear>(3, 3));
      a = register_module("a", std::make_shared<nn::Linear>(3, 3));
    }
  }
  Tensor forward(const Tensor& x) override { return b->forward(a->forward(x)); }
  std::string type_name() const override { return "TwoLayers"; }
  std::shared_ptr<nn::Linear> a, b;
};

// One Linear registered as "x" and as "y", and another as "z": in the order
// x, z, y or z, y, x. Its parameters have two names each; the optimizer sees
// them in another order.
struct SharedLayer : nn::Module {
  explicit SharedLayer(bool x_first) {
    auto shared = std::make_shared<nn::Linear>(3, 3);
    if (x_first) {
      register_module("x", shared);
      z = register_module("z", std::make_shared<nn::Linear>(3, 3));
      register_module("y", shared);
    } else {
      z = register_module("z", std::make_shared<nn::Linear>(3, 3));
      register_module("y", shared);
      register_module("x", shared);
    }
    x = shared;
  }
  Tensor forward(const Tensor& in) override { return z->forward(x->forward(in)); }
  std::string type_name() const override { return "SharedLayer"; }
  std::shared_ptr<nn::Linear> x, z;
};

// Each parameter's momentum buffer, by its name in `model`.
std::map<std::string, std::vector<float>> momentum_by_name(const nn::Module& model,
                                                           const Optimizer& opt) {
  const OptimizerState state = opt.state_dict();
  std::map<std::string, std::vector<float>> out;
  int64_t index = 0;
  for (const auto& [name, p] : model.named_parameters())
    out[name] = state.state.at(index++).at("momentum_buffer").to_vector<float>();
  return out;
}

}  // namespace

TEST_CASE("An optimizer's state goes back to the parameters of its names in any order",
          "[optim][checkpoint]") {
  TwoLayers saved_model(/*a_first=*/true);
  SGD saved_opt(saved_model.parameters(), {.lr = 0.1, .momentum = 0.9});
  float fill = 1;
  for (auto& p : saved_model.parameters()) p.set_grad(Tensor::full(p.shape(), fill++));
  saved_opt.step();
  TrainingParts saved_parts{.model = &saved_model, .optimizer = &saved_opt};
  const runtime::CheckpointContent c = training_checkpoint_content(saved_parts, {});

  const bool a_first = GENERATE(true, false);
  INFO("the loading model registers a first: " << a_first);
  TwoLayers model(a_first);
  SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9});
  restore_training_checkpoint(c, {.model = &model, .optimizer = &opt}, "ckpt");
  CHECK((momentum_by_name(model, opt) == momentum_by_name(saved_model, saved_opt)));

  // ZeRO numbers the parameters as the plain optimizer does.
  ZeroRedundancyOptimizer zero(model.parameters(), testing::one_rank_group_ptr(),
                               [](std::vector<ParamGroup> g) -> std::unique_ptr<Optimizer> {
                                 return std::make_unique<SGD>(std::move(g), SGDOptions{
                                     .lr = 0.1, .momentum = 0.9});
                               });
  restore_training_checkpoint(c, {.model = &model, .optimizer = &zero}, "ckpt");
  zero.consolidate_state_dict(0);
  CHECK((momentum_by_name(model, zero) == momentum_by_name(saved_model, saved_opt)));
}

TEST_CASE("An optimizer's state goes back by name to a module registered under two names",
          "[optim][checkpoint]") {
  SharedLayer saved_model(/*x_first=*/true);
  SGD saved_opt(saved_model.parameters(), {.lr = 0.1, .momentum = 0.9});
  float fill = 1;
  for (auto& p : saved_model.parameters()) p.set_grad(Tensor::full(p.shape(), fill++));
  saved_opt.step();
  const runtime::CheckpointContent c =
      training_checkpoint_content({.model = &saved_model, .optimizer = &saved_opt}, {});

  SharedLayer model(/*x_first=*/false);
  SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9});
  restore_training_checkpoint(c, {.model = &model, .optimizer = &opt}, "ckpt");
  const auto by_name = [](const SharedLayer& m, const Optimizer& o) {
    std::map<const runtime::TensorImpl*, std::vector<float>> momentum;
    const OptimizerState state = o.state_dict();
    int64_t index = 0;
    for (const auto& p : m.parameters())
      momentum[p.impl_ptr()] = state.state.at(index++).at("momentum_buffer").to_vector<float>();
    return std::vector<std::vector<float>>{
        momentum.at(m.x->weight.impl_ptr()), momentum.at(m.x->bias.impl_ptr()),
        momentum.at(m.z->weight.impl_ptr()), momentum.at(m.z->bias.impl_ptr())};
  };
  CHECK((by_name(model, opt) == by_name(saved_model, saved_opt)));
}

TEST_CASE("A resume whose parameter groups are built in another order is refused, not given "
          "swapped rates",
          "[optim][checkpoint]") {
  // The run trained the head ("b") first and added the backbone ("a") with a
  // lower rate when it unfroze it.
  TwoLayers saved_model(/*a_first=*/true);
  SGD saved_opt(std::vector<ParamGroup>{{{saved_model.b->weight, saved_model.b->bias}, {{"lr", 0.1}}}},
                {.momentum = 0.9});
  saved_opt.add_param_group({{saved_model.a->weight, saved_model.a->bias}, {{"lr", 0.001}}});
  for (auto& p : saved_model.parameters()) p.set_grad(Tensor::full(p.shape(), 1.0f));
  saved_opt.step();
  const runtime::CheckpointContent c =
      training_checkpoint_content({.model = &saved_model, .optimizer = &saved_opt}, {});

  TwoLayers model(/*a_first=*/true);
  SECTION("the groups in the order the run saved them: each keeps its rate") {
    SGD opt(std::vector<ParamGroup>{{{model.b->weight, model.b->bias}, {{"lr", 0.5}}}}, {.momentum = 0.9});
    opt.add_param_group({{model.a->weight, model.a->bias}, {{"lr", 0.5}}});
    restore_training_checkpoint(c, {.model = &model, .optimizer = &opt}, "ckpt");
    CHECK(opt.param_groups()[0].options.at("lr") == 0.1);
    CHECK(opt.param_groups()[1].options.at("lr") == 0.001);
  }
  SECTION("the backbone's group first, as the model lists it: refused, nothing changed") {
    SGD opt(std::vector<ParamGroup>{{{model.a->weight, model.a->bias}, {{"lr", 0.5}}}}, {.momentum = 0.9});
    opt.add_param_group({{model.b->weight, model.b->bias}, {{"lr", 0.5}}});
    const std::string error = testing::error_of(
        [&] { restore_training_checkpoint(c, {.model = &model, .optimizer = &opt}, "ckpt"); });
    CHECK_THAT(error, Contains("parameter 'a.weight' is in this optimizer's parameter group 0, "
                               "but the run saved it in group 1"));
    CHECK_THAT(error, Contains("Build the parameter groups as the run that saved it did"));
    CHECK(opt.param_groups()[0].options.at("lr") == 0.5);
    CHECK(opt.param_groups()[1].options.at("lr") == 0.5);
    CHECK(opt.state_dict().state.empty());
  }
}

TEST_CASE("A new learning rate on resume is refused where the groups train at different rates",
          "[optim][checkpoint]") {
  // A head at 0.1 and a backbone at 0.001 below it.
  TwoLayers saved_model(/*a_first=*/true);
  SGD saved_opt(std::vector<ParamGroup>{{{saved_model.b->weight, saved_model.b->bias}, {{"lr", 0.1}}},
                                        {{saved_model.a->weight, saved_model.a->bias}, {{"lr", 0.001}}}},
                {.momentum = 0.9});
  const bool with_scheduler = GENERATE(false, true);
  INFO("with a cosine schedule at its floor: " << with_scheduler);
  // At the end of a cosine schedule every group sits at eta_min: equal rates,
  // different bases.
  std::optional<CosineLR> saved_sched;
  if (with_scheduler) {
    saved_sched.emplace(saved_opt, CosineLROptions{.t_max = 2});
    saved_sched->step();
    saved_sched->step();
  }
  const runtime::CheckpointContent c = training_checkpoint_content(
      {.model = &saved_model, .optimizer = &saved_opt,
       .scheduler = saved_sched ? &*saved_sched : nullptr},
      {});

  TwoLayers model(/*a_first=*/true);
  SGD opt(std::vector<ParamGroup>{{{model.b->weight, model.b->bias}, {{"lr", 0.1}}},
                                  {{model.a->weight, model.a->bias}, {{"lr", 0.001}}}},
          {.momentum = 0.9});
  std::optional<CosineLR> sched;
  if (with_scheduler) sched.emplace(opt, CosineLROptions{.t_max = 2});
  const TrainingParts parts{.model = &model, .optimizer = &opt,
                            .scheduler = sched ? &*sched : nullptr};
  const std::string error = testing::error_of(
      [&] { restore_training_checkpoint(c, parts, "ckpt", 0, 1, {.lr = 0.05}); });
  CHECK_THAT(error, Contains("a new learning rate (0.05) was asked for"));
  CHECK_THAT(error, Contains("0.1, 0.001"));
  CHECK(opt.param_groups()[0].options.at("lr") == 0.1);
  CHECK(opt.param_groups()[1].options.at("lr") == 0.001);
  // Without a new rate, each group goes on at its own.
  restore_training_checkpoint(c, parts, "ckpt");
  if (with_scheduler) CHECK((sched->base_lrs() == std::vector<double>{0.1, 0.001}));
  else CHECK(opt.param_groups()[1].options.at("lr") == 0.001);
}

TEST_CASE("A checkpoint's scheduler must drive its optimizer: the one left from before a new "
          "optimizer is refused",
          "[optim][checkpoint]") {
  TwoLayers model(/*a_first=*/true);
  SGD head_opt({model.b->weight, model.b->bias}, {.lr = 0.1});
  StepLR sched(head_opt, {.step_size = 1, .gamma = 0.5});
  const runtime::CheckpointContent c =
      training_checkpoint_content({.model = &model, .optimizer = &head_opt, .scheduler = &sched}, {});
  // Unfrozen: a new optimizer over head and backbone, the old scheduler kept.
  SGD full_opt(std::vector<ParamGroup>{{{model.b->weight, model.b->bias}, {}},
                                       {{model.a->weight, model.a->bias}, {{"lr", 0.01}}}},
               {.lr = 0.1});
  const TrainingParts stale{.model = &model, .optimizer = &full_opt, .scheduler = &sched};
  CHECK_THROWS_WITH(training_checkpoint_content(stale, {}),
                    Contains("save_training_checkpoint: TrainingParts::scheduler (StepLR) was "
                             "made for another optimizer than TrainingParts::optimizer (SGD)") &&
                        Contains("make a scheduler for it and pass both"));
  CHECK_THROWS_WITH(restore_training_checkpoint(c, stale, "ckpt"),
                    Contains("load_training_checkpoint: TrainingParts::scheduler (StepLR) was "
                             "made for another optimizer"));
}
