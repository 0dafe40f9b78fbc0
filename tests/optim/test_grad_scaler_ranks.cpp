// GradScaler at two ranks (rank threads): a skipped step is skipped on every
// rank. Without DDP (gradients computed locally, plain or ZeRO optimizer) an
// overflow on rank 1 alone reaches rank 0 only through the scaler's group;
// under DDP the averaged gradients carry it, with or without a group.
#include <catch2/catch.hpp>

#include <limits>
#include <memory>
#include <vector>

#include "lockstep/optim/grad_scaler.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/optim/zero_redundancy_optimizer.h"
#include "nn/ddp/ddp_fixture.h"
#include "support/test_util.h"

namespace lt = lockstep::testing;
using namespace lockstep;
using namespace lockstep::optim;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

lt::Batch poisoned(lt::Batch b) {
  b.x = b.x + Tensor::full(b.x.shape(), kInf);
  return b;
}

std::vector<double> all_values(nn::Module& m) {
  std::vector<double> out;
  for (const Tensor& p : m.parameters())
    for (double v : lt::values(p)) out.push_back(v);
  return out;
}

struct RankResult {
  std::vector<bool> stepped;
  double scale = 0;
  std::vector<double> params;
};

}  // namespace

TEST_CASE("With a group, an overflow on one rank skips the step on every rank",
          "[optim][grad_scaler][ranks]") {
  const bool zero = GENERATE(false, true);
  INFO((zero ? "ZeroRedundancyOptimizer" : "SGD"));
  std::vector<RankResult> results(2);
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    auto model = lt::small_mlp(3);  // the same weights on both ranks
    std::unique_ptr<Optimizer> opt;
    if (zero) {
      opt = std::make_unique<ZeroRedundancyOptimizer>(
          model->parameters(), group, [](std::vector<ParamGroup> shard) {
            return std::make_unique<SGD>(std::move(shard), SGDOptions{.lr = 0.1, .momentum = 0.9});
          });
    } else {
      opt = std::make_unique<SGD>(model->parameters(), SGDOptions{.lr = 0.1, .momentum = 0.9});
    }
    GradScaler scaler(group);
    const lt::Batch batch = lt::global_batch(8, 1);
    const std::vector<double> initial = all_values(*model);
    for (int step = 0; step < 3; ++step) {
      opt->zero_grad();
      // Local gradients: rank 1 overflows at step 0, rank 0 never does.
      const lt::Batch b = step == 0 && r == 1 ? poisoned(batch) : batch;
      scaler.scale(lt::loss_of(*model, b)).backward();
      results[r].stepped.push_back(scaler.step(*opt));
      scaler.update();
      if (step == 0 && all_values(*model) != initial) return "the skipped step changed parameters";
    }
    results[r].scale = scaler.get_scale();
    results[r].params = all_values(*model);
    return "";
  }, "grad_scaler");
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(problems[r] == "");
    CHECK(results[r].stepped == std::vector<bool>{false, true, true});
    CHECK(results[r].scale == 32768.0);
  }
  CHECK(results[0].params == results[1].params);
}

TEST_CASE("Under DDP an overflow on one rank at step k skips step k on both ranks",
          "[optim][grad_scaler][ranks][ddp]") {
  const bool with_group = GENERATE(false, true);
  INFO("scaler group: " << with_group);
  constexpr int kSteps = 5, kOverflow = 2;
  std::vector<RankResult> results(2);
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    auto model = lt::small_mlp(3);
    nn::DistributedDataParallel ddp(model, group);
    SGD sgd(model->parameters(), {.lr = 0.1});
    GradScaler scaler(with_group ? group : nullptr, {.growth_interval = 2});
    std::vector<double> before;
    for (int step = 0; step < kSteps; ++step) {
      lt::Batch b = lt::shard(lt::global_batch(8, 10 + static_cast<uint64_t>(step)), r, 2);
      if (step == kOverflow && r == 1) b = poisoned(b);
      if (step == kOverflow) before = all_values(*model);
      sgd.zero_grad();
      scaler.scale(lt::loss_of(ddp, b)).backward();
      results[r].stepped.push_back(scaler.step(sgd));
      scaler.update();
      if (step == kOverflow && all_values(*model) != before) return "step k changed parameters";
    }
    results[r].scale = scaler.get_scale();
    results[r].params = all_values(*model);
    return "";
  }, "grad_scaler_ddp");
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(problems[r] == "");
    CHECK(results[r].stepped == std::vector<bool>{true, true, false, true, true});
    // 65536 -> 131072 after two clean steps, halved at k, then two clean again.
    CHECK(results[r].scale == 131072.0);
  }
  CHECK(results[0].params == results[1].params);
}

TEST_CASE("With a group, a rank whose optimizer has no gradient fails step on every rank",
          "[optim][grad_scaler][ranks]") {
  // Failing on that rank alone would leave the others waiting in their next
  // collective until it timed out.
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    auto model = lt::small_mlp(3);
    SGD opt(model->parameters(), SGDOptions{.lr = 0.1});
    GradScaler scaler(group);
    scaler.scale(lt::loss_of(*model, lt::global_batch(8, 1))).backward();
    if (r == 1) opt.zero_grad();  // a misplaced zero_grad on one rank
    scaler.step(opt);
    return "stepped";
  }, "grad_scaler_none");
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK_THAT(problems[r], Catch::Contains("No inf checks were recorded for this optimizer") &&
                                Catch::Contains(r == 1 ? "on this rank" : "on another rank"));
  }
}
