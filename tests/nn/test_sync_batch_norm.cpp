// SyncBatchNorm in one process (one thread per rank over gloo and a
// MemoryStore): equal to BatchNorm on the global batch, uneven and empty local
// batches included (see nn/sync_bn_check.h for what is compared and the
// tolerance); eval mode and a single rank communicate nothing; and
// convert_sync_batchnorm replaces every BatchNorm keeping state_dict keys and
// values.
#include <catch2/catch.hpp>

#include "lockstep/config.h"
#include "lockstep/models/models.h"
#include "lockstep/nn/nn.h"
#include "lockstep/nn/sync_batch_norm.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/random.h"
#include "nn/sync_bn_check.h"
#include "collectives/rank_threads.h"
#include "support/test_util.h"

using namespace lockstep::nn;
using namespace lockstep::testing;
namespace models = lockstep::models;
namespace lr = lockstep::runtime;
using lockstep::runtime::DType;
using Catch::Contains;
using namespace std::chrono_literals;

namespace {

int count_type(Module& m, const std::string& type) {
  int n = 0;
  for (const auto& [name, sub] : m.named_modules()) n += sub->type_name() == type ? 1 : 0;
  return n;
}

// state_dict keys in order, and every value equal.
void check_same_state(const Module& a, const Module& b) {
  const StateDict da = a.state_dict(), db = b.state_dict();
  const auto& sa = da.items();
  const auto& sb = db.items();
  REQUIRE(sa.size() == sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    INFO(sa[i].first);
    CHECK(sa[i].first == sb[i].first);
    CHECK(bitwise_equal(sa[i].second, sb[i].second));
  }
}

}  // namespace

TEST_CASE("SyncBatchNorm under activation checkpointing counts each batch once",
          "[nn][syncbn][checkpoint]") {
  // Backward's recomputation runs the forward again, collectives included; the
  // running statistics and their count must move once a step, as without it.
  const int world = 2;
  const auto groups = make_groups("shm", world, "syncbn-checkpoint");
  std::vector<std::vector<std::string>> found(static_cast<size_t>(world));
  const auto errors = run_ranks(world, [&](int r) {
    const auto& group = groups[static_cast<size_t>(r)];
    for (const auto momentum : {std::optional<double>(0.1), std::optional<double>()}) {
      const BatchNormOptions options{.momentum = momentum};
      auto plain = std::make_shared<SyncBatchNorm>(2, group, options);
      auto inner = std::make_shared<SyncBatchNorm>(2, group, options);
      auto wrapped = std::make_shared<Checkpoint>(inner);
      lr::Generator g(static_cast<uint64_t>(10 + r));
      for (int step = 0; step < 2; ++step) {
        const lr::Tensor x = lr::randn({3 + r, 2}, DType::f32, g).requires_grad_();
        lr::sum(lr::mul((*plain)(x), x)).backward();
        lr::sum(lr::mul((*wrapped)(x), x)).backward();
      }
      auto& mine = found[static_cast<size_t>(r)];
      for (const char* name : {"running_mean", "running_var", "num_batches_tracked"})
        if (!bitwise_equal(plain->state_dict().at(name), inner->state_dict().at(name)))
          mine.push_back(fmt::format("{} (momentum {})", name, momentum.value_or(-1)));
      if (!bitwise_equal(plain->weight.grad(), inner->weight.grad())) mine.push_back("weight.grad");
    }
  });
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r << ": " << message_of(errors[static_cast<size_t>(r)]));
    CHECK_FALSE(errors[static_cast<size_t>(r)]);
    CHECK(found[static_cast<size_t>(r)] == std::vector<std::string>{});
  }
}

TEST_CASE("SyncBatchNorm: a global batch of one value per channel is refused and not counted",
          "[nn][syncbn]") {
  // Refused on every rank; with momentum unset a count moved by it would
  // leave the cumulative average of the later batches wrong on every rank.
  const int world = 2;
  const auto groups = make_groups("shm", world, "syncbn-refused");
  std::vector<std::vector<double>> found(static_cast<size_t>(world));
  std::vector<std::string> refused(static_cast<size_t>(world));
  const auto errors = run_ranks(world, [&](int r) {
    SyncBatchNorm bn(1, groups[static_cast<size_t>(r)], {.momentum = std::nullopt});
    // Global batches {1, 3} (mean 2, unbiased var 2), {100}, {5, 9} (7, 8).
    bn.forward(Tensor::from_vector<float>({r == 0 ? 1.0f : 3.0f}, {1, 1}));
    refused[static_cast<size_t>(r)] = error_of([&] {
      bn.forward(r == 0 ? Tensor::from_vector<float>({100}, {1, 1}) : Tensor::zeros({0, 1}));
    });
    bn.forward(Tensor::from_vector<float>({r == 0 ? 5.0f : 9.0f}, {1, 1}));
    found[static_cast<size_t>(r)] = {bn.num_batches_tracked.item(), values(bn.running_mean)[0],
                                     values(bn.running_var)[0]};
  });
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    REQUIRE(message_of(errors[static_cast<size_t>(r)]) == "<no exception>");
    CHECK_THAT(refused[static_cast<size_t>(r)], Contains("more than 1 value per channel"));
    const auto& f = found[static_cast<size_t>(r)];
    CHECK(f[0] == 2);
    CHECK(f[1] == Approx((2.0 + 7.0) / 2));
    CHECK(f[2] == Approx((2.0 + 8.0) / 2));
  }
}

#if LOCKSTEP_HAVE_GLOO

namespace {

// Runs `c` on `world` gloo ranks in threads; CHECKs that no rank found a mismatch.
void run_case(int world, const SyncBnCase& c) {
  auto groups = make_groups("gloo", world, "syncbn");
  std::vector<std::vector<std::string>> found(static_cast<size_t>(world));
  const auto errors = run_ranks(world, [&](int r) {
    found[static_cast<size_t>(r)] = check_sync_bn_rank(groups[static_cast<size_t>(r)], c);
  });
  for (int r = 0; r < world; ++r) {
    INFO("case " << c.name << ", rank " << r);
    CHECK(message_of(errors[static_cast<size_t>(r)]) == "<no exception>");
    for (const auto& e : found[static_cast<size_t>(r)]) FAIL_CHECK(e);
  }
}

}  // namespace

TEST_CASE("SyncBatchNorm equals BatchNorm on the global batch, 2 uneven ranks",
          "[nn][syncbn][gloo]") {
  const DType dtype = GENERATE(DType::f32, DType::f64);
  const std::vector<int64_t> tail = GENERATE(std::vector<int64_t>{}, std::vector<int64_t>{5},
                                             std::vector<int64_t>{3, 4});
  run_case(2, {.name = "2 ranks", .batch_sizes = {3, 6}, .channels = 4, .tail = tail,
               .dtype = dtype});
}

TEST_CASE("SyncBatchNorm equals BatchNorm on the global batch, 4 ranks, one empty",
          "[nn][syncbn][gloo]") {
  const std::vector<int64_t> tail = GENERATE(std::vector<int64_t>{}, std::vector<int64_t>{5},
                                             std::vector<int64_t>{3, 4});
  run_case(4, {.name = "4 ranks", .batch_sizes = {2, 0, 5, 1}, .channels = 3, .tail = tail});
}

TEST_CASE("SyncBatchNorm: cumulative momentum, no affine, no running stats",
          "[nn][syncbn][gloo]") {
  run_case(2, {.name = "momentum=None", .batch_sizes = {1, 4}, .tail = {2, 2},
               .options = {.momentum = std::nullopt}, .steps = 3});
  run_case(2, {.name = "affine=false", .batch_sizes = {4, 2}, .tail = {3},
               .options = {.affine = false}});
  run_case(4, {.name = "track_running_stats=false", .batch_sizes = {0, 3, 0, 2}, .tail = {},
               .options = {.track_running_stats = false}});
}

TEST_CASE("SyncBatchNorm: one value per channel over all ranks is refused on every rank",
          "[nn][syncbn][gloo]") {
  auto groups = make_groups("gloo", 2, "syncbn-one");
  const auto errors = run_ranks(2, [&](int r) {
    SyncBatchNorm bn(2, groups[static_cast<size_t>(r)]);
    bn.forward(Tensor::ones({r == 0 ? 1 : 0, 2}));
  });
  for (const auto& e : errors) CHECK_THAT(message_of(e), Contains("more than 1 value per channel"));
}

TEST_CASE("SyncBatchNorm in eval mode equals BatchNorm and communicates nothing",
          "[nn][syncbn][gloo]") {
  // Rank 1 never calls: any collective on rank 0 would time out (2 s).
  auto groups = make_groups("gloo", 2, "syncbn-eval", 2s);
  BatchNorm2d bn(3);
  SyncBatchNorm sync(3, groups[0]);
  {
    lockstep::runtime::NoGradGuard no_grad;
    for (BatchNormBase* m : std::initializer_list<BatchNormBase*>{&bn, &sync}) {
      m->running_mean.copy_(Tensor::from_vector(std::vector<float>{0.5f, -1.0f, 2.0f}, {3}));
      m->running_var.copy_(Tensor::from_vector(std::vector<float>{1.5f, 0.25f, 4.0f}, {3}));
      m->weight.copy_(Tensor::from_vector(std::vector<float>{1.1f, 0.9f, -0.5f}, {3}));
    }
  }
  bn.eval();
  sync.eval();
  lockstep::runtime::Generator g(4);
  Tensor x = lockstep::runtime::randn({2, 3, 4, 4}, DType::f32, g);
  x.requires_grad_();
  Tensor x2 = x.detach().clone();
  x2.requires_grad_();
  const Tensor want = bn.forward(x);
  const Tensor got = sync.forward(x2);
  CHECK(bitwise_equal(got.detach(), want.detach()));
  lockstep::runtime::sum(want).backward();
  lockstep::runtime::sum(got).backward();
  CHECK(bitwise_equal(x2.grad(), x.grad()));
  CHECK(sync.num_batches_tracked.item() == 0);
}

TEST_CASE("SyncBatchNorm: a group of size 1 or none behaves exactly like BatchNorm",
          "[nn][syncbn][gloo]") {
  auto groups = make_groups("gloo", 1, "syncbn-single");
  const bool with_group = GENERATE(false, true);
  BatchNorm1d bn(4, {.momentum = std::nullopt});
  SyncBatchNorm sync(4, with_group ? groups[0] : nullptr, {.momentum = std::nullopt});
  lockstep::runtime::Generator g(5);
  for (int step = 0; step < 2; ++step) {
    const Tensor x = lockstep::runtime::randn({6, 4, 3}, DType::f32, g);
    CHECK(bitwise_equal(sync.forward(x), bn.forward(x)));
  }
  CHECK(bitwise_equal(sync.running_mean, bn.running_mean));
  CHECK(bitwise_equal(sync.running_var, bn.running_var));
  CHECK(bitwise_equal(sync.num_batches_tracked, bn.num_batches_tracked));
}

#endif  // LOCKSTEP_HAVE_GLOO

TEST_CASE("SyncBatchNorm: input checks", "[nn][syncbn]") {
  SyncBatchNorm bn(3, nullptr);
  CHECK(bn.type_name() == "SyncBatchNorm");
  CHECK_THAT(error_of([&] { bn.forward(Tensor::ones({3})); }), Contains("expected input [N, C]"));
  CHECK_THAT(error_of([&] { bn.forward(Tensor::ones({2, 4})); }), Contains("4 channels"));
  CHECK_NOTHROW(bn.forward(Tensor::ones({2, 3, 2, 2, 2})));
}

TEST_CASE("convert_sync_batchnorm replaces every BatchNorm in fashion_cnn, keeping the state",
          "[nn][syncbn]") {
  auto model = models::fashion_cnn(7);
  // Non-default running statistics, so a copy of defaults would not pass.
  model->train();
  model->forward(lockstep::runtime::randn({4, 1, 28, 28}));
  model->eval();
  const StateDict before = model->state_dict();
  auto original = models::fashion_cnn(7);
  original->load_state_dict(before);
  original->eval();

  auto converted = convert_sync_batchnorm(model, nullptr);
  CHECK(converted == model);  // changed in place
  CHECK(count_type(*converted, "BatchNorm2d") == 0);
  CHECK(count_type(*converted, "SyncBatchNorm") == 2);
  check_same_state(*original, *converted);
  for (const auto& [name, m] : converted->named_modules()) CHECK_FALSE(m->is_training());
  // The converted model computes the same (eval: no communication).
  const Tensor x = lockstep::runtime::randn({2, 1, 28, 28});
  CHECK(bitwise_equal(converted->forward(x), original->forward(x)));
  // A state_dict of the BatchNorm model loads into the converted one.
  const LoadResult r = converted->load_state_dict(original->state_dict());
  CHECK(r.missing_keys.empty());
  CHECK(r.unexpected_keys.empty());
}

TEST_CASE("convert_sync_batchnorm: nested containers, options and a BatchNorm at the root",
          "[nn][syncbn]") {
  using Modules = std::initializer_list<std::shared_ptr<Module>>;
  auto inner = std::make_shared<Sequential>(
      Modules{std::make_shared<Linear>(4, 6),
              std::make_shared<BatchNorm1d>(6, BatchNormOptions{.eps = 1e-3,
                                                                .momentum = std::nullopt})});
  auto frozen = std::make_shared<BatchNorm2d>(2);
  frozen->weight.requires_grad_(false);
  auto model = std::make_shared<Sequential>(
      Modules{inner, std::make_shared<Sequential>(Modules{std::make_shared<ReLU>(), frozen}),
              std::make_shared<BatchNorm1d>(6, BatchNormOptions{.affine = false})});
  {
    lockstep::runtime::NoGradGuard no_grad;
    inner->at<BatchNorm1d>(1)->running_mean.fill_(0.25);
    inner->at<BatchNorm1d>(1)->num_batches_tracked.fill_(3);
  }
  const StateDict before = model->state_dict();
  std::vector<std::string> keys;
  for (const auto& [k, v] : before) keys.push_back(k);
  std::vector<Tensor> copies;
  for (const auto& [k, v] : before) copies.push_back(v.clone());

  auto converted = convert_sync_batchnorm(model, nullptr);
  CHECK(count_type(*converted, "SyncBatchNorm") == 3);
  CHECK(count_type(*converted, "BatchNorm1d") + count_type(*converted, "BatchNorm2d") == 0);
  const StateDict after_dict = converted->state_dict();
  const auto& after = after_dict.items();
  REQUIRE(after.size() == keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    INFO(keys[i]);
    CHECK(after[i].first == keys[i]);
    CHECK(bitwise_equal(after[i].second, copies[i]));
  }
  auto sync = std::dynamic_pointer_cast<SyncBatchNorm>(inner->at<Module>(1));
  REQUIRE(sync != nullptr);
  CHECK(sync->options.eps == 1e-3);
  CHECK_FALSE(sync->options.momentum.has_value());
  auto sync_frozen = model->at<Sequential>(1)->at<SyncBatchNorm>(1);
  CHECK_FALSE(sync_frozen->weight.requires_grad());
  CHECK(sync_frozen->bias.requires_grad());
  CHECK_FALSE(model->at<SyncBatchNorm>(2)->options.affine);

  // A BatchNorm at the root is replaced too (a new root is returned).
  auto root = std::make_shared<BatchNorm1d>(5);
  auto new_root = convert_sync_batchnorm(root, nullptr);
  CHECK(new_root != root);
  CHECK(new_root->type_name() == "SyncBatchNorm");
  check_same_state(*root, *new_root);
  // f64 modules stay f64.
  auto wide = std::make_shared<BatchNorm1d>(2);
  wide->to(DType::f64);
  CHECK(convert_sync_batchnorm(wide, nullptr)->state_dict().at("weight").dtype() == DType::f64);
}

TEST_CASE("convert_sync_batchnorm puts a SyncBatchNorm already in the model on the new group",
          "[nn][syncbn]") {
  // As torch.nn.SyncBatchNorm.convert_sync_batchnorm, which converts every
  // _BatchNorm: a model built with SyncBatchNorm(C, nullptr) before a group
  // existed is converted to synchronise, not left computing local statistics.
  const int world = 2;
  const auto groups = make_groups("shm", world, "syncbn-reconvert");
  using Modules = std::initializer_list<std::shared_ptr<Module>>;
  std::vector<std::vector<double>> means(static_cast<size_t>(world));
  std::vector<std::string> problems(static_cast<size_t>(world));
  const auto errors = run_ranks(world, [&](int r) {
    const auto& group = groups[static_cast<size_t>(r)];
    auto unsynced = std::make_shared<SyncBatchNorm>(1, nullptr, BatchNormOptions{.eps = 1e-3});
    {
      lockstep::runtime::NoGradGuard no_grad;
      unsynced->running_mean.fill_(0.5);
      unsynced->num_batches_tracked.fill_(4);
    }
    auto model = std::make_shared<Sequential>(
        Modules{std::make_shared<Sequential>(Modules{unsynced}), std::make_shared<ReLU>()});
    const StateDict before = model->state_dict();
    auto converted = convert_sync_batchnorm(model, group);
    auto sync = model->at<Sequential>(0)->at<SyncBatchNorm>(0);
    if (sync->group() != group) problems[static_cast<size_t>(r)] += "not on the new group; ";
    if (sync->options.eps != 1e-3) problems[static_cast<size_t>(r)] += "options lost; ";
    for (const auto& [k, v] : before)
      if (!bitwise_equal(converted->state_dict().at(k), v))
        problems[static_cast<size_t>(r)] += k + " changed; ";
    // Global batch {0, 4}: mean 2 on both ranks (rank-local would be 0 and 4).
    (*converted)(Tensor::from_vector<float>({r == 0 ? 0.0f : 4.0f}, {1, 1}));
    means[static_cast<size_t>(r)] = values(sync->running_mean);
    // Converted again on the same group: nothing to change, the same module.
    convert_sync_batchnorm(model, group);
    if (model->at<Sequential>(0)->at<SyncBatchNorm>(0) != sync)
      problems[static_cast<size_t>(r)] += "remade on its own group; ";
  });
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    REQUIRE(message_of(errors[static_cast<size_t>(r)]) == "<no exception>");
    CHECK(problems[static_cast<size_t>(r)] == "");
    REQUIRE(means[static_cast<size_t>(r)].size() == 1);
    CHECK(means[static_cast<size_t>(r)][0] == Approx(0.9 * 0.5 + 0.1 * 2));
  }
}

TEST_CASE("Module::replace_child keeps the position and refuses unknown names",
          "[nn][syncbn][module]") {
  auto seq = std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
      std::make_shared<Linear>(2, 3), std::make_shared<ReLU>()});
  seq->replace_child("0", std::make_shared<Linear>(2, 4));
  CHECK(seq->at<Linear>(0)->weight.shape() == lockstep::runtime::Shape{4, 2});
  CHECK(seq->named_children()[0].first == "0");
  CHECK_THAT(error_of([&] { seq->replace_child("7", std::make_shared<ReLU>()); }),
             Contains("no submodule of that name"));
  CHECK_THAT(error_of([&] { seq->replace_child("0", nullptr); }), Contains("null"));
}
