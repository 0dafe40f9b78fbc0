// nn::Join: three rank threads whose shards hold 2, 4 and 7 batches train
// with DDP (SyncBatchNorm, or BatchNorm with per-rank statistics) and SGD or
// ZeRO; the result is a one-process run that steps, at each iteration, on the
// batches of the ranks still active. Also the divisor option, compression
// hooks, misuse errors, and the same run without Join failing fast.
#include <catch2/catch.hpp>

#include <memory>
#include <optional>
#include <vector>

#include "lockstep/nn/join.h"
#include "lockstep/nn/normalization.h"
#include "lockstep/nn/sync_batch_norm.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/optim/zero_redundancy_optimizer.h"
#include "lockstep/runtime/data/loader.h"
#include "nn/ddp/ddp_fixture.h"
#include "support/test_util.h"

namespace lt = lockstep::testing;
namespace nn = lockstep::nn;
namespace optim = lockstep::optim;
namespace rt = lockstep::runtime;
using lockstep::collectives::ProcessGroup;
using rt::Tensor;

namespace {

constexpr int kWorld = 3;
constexpr int64_t kBatch = 4, kIn = 6, kClasses = 3;
const std::vector<int64_t> kShardBatches = {2, 4, 7};  // per rank
constexpr int64_t kSteps = 7;                          // the longest shard

// The samples of every rank: rank r's shard is batches [first(r), first(r) +
// kShardBatches[r]) of one pool of 13 batches.
const rt::TensorDataset& pool() {
  static const rt::TensorDataset data = [] {
    const lt::Batch b = lt::global_batch(13 * kBatch, 11, kIn);
    std::vector<int64_t> y = b.y.to_vector<int64_t>();
    for (auto& v : y) v %= kClasses;
    return rt::TensorDataset(b.x, Tensor::from_vector(y, {static_cast<int64_t>(y.size())}));
  }();
  return data;
}

int64_t first_batch(int rank) {
  int64_t first = 0;
  for (int r = 0; r < rank; ++r) first += kShardBatches[static_cast<size_t>(r)];
  return first;
}

rt::TensorDataset shard_of(int rank) {
  std::vector<int64_t> rows;
  const int64_t lo = first_batch(rank) * kBatch;
  for (int64_t i = 0; i < kShardBatches[static_cast<size_t>(rank)] * kBatch; ++i)
    rows.push_back(lo + i);
  const rt::Batch b = pool().get_batch(rows);
  return rt::TensorDataset(b.x, b.y);
}

std::shared_ptr<nn::Sequential> make_model(std::shared_ptr<nn::Module> norm) {
  rt::Generator g(5);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(kIn, 8, true, g));
  m->push_back(std::move(norm));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::Linear>(8, kClasses, true, g));
  return m;
}

struct Config {
  bool sync_bn = true;  // SyncBatchNorm; else BatchNorm1d, per-rank statistics
  bool zero = false;    // ZeroRedundancyOptimizer over SGD; else SGD
  bool divide_by_initial_world_size = false;
  std::optional<nn::CommHook> hook;
};

std::unique_ptr<optim::Optimizer> make_sgd(std::vector<Tensor> params) {
  return std::make_unique<optim::SGD>(std::move(params),
                                      optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
}

struct RankResult {
  std::vector<Tensor> params, buffers;
  std::vector<int> active;     // active_ranks() per iteration
  std::vector<bool> joined;    // joined() per iteration
  std::vector<double> losses;  // per iteration
};

RankResult train_rank(int rank, const std::shared_ptr<ProcessGroup>& group, const Config& c) {
  std::shared_ptr<nn::Module> norm;
  if (c.sync_bn) {
    norm = std::make_shared<nn::SyncBatchNorm>(8, group);
  } else {
    norm = std::make_shared<nn::BatchNorm1d>(8);
  }
  auto model = make_model(norm);
  auto ddp = std::make_shared<nn::DistributedDataParallel>(
      model, group, nn::DdpOptions{.divide_by_initial_world_size = c.divide_by_initial_world_size});
  if (c.hook) ddp->register_comm_hook(*c.hook);
  std::unique_ptr<optim::Optimizer> opt;
  if (c.zero) {
    opt = std::make_unique<optim::ZeroRedundancyOptimizer>(
        model->parameters(), group,
        [](std::vector<optim::ParamGroup> shard) {
          return std::make_unique<optim::SGD>(std::move(shard),
                                              optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
        });
  } else {
    opt = make_sgd(model->parameters());
  }
  const rt::TensorDataset data = shard_of(rank);
  rt::DataLoader loader(data, {.batch_size = kBatch});
  RankResult out;
  nn::Join join(*group);
  for (const rt::Batch& b : join.batches(loader)) {
    opt->zero_grad();
    Tensor loss = rt::cross_entropy(ddp->forward(b.x), b.y);
    loss.backward();
    opt->step();
    out.active.push_back(join.active_ranks());
    out.joined.push_back(join.joined());
    out.losses.push_back(loss.item());
  }
  if (join.active_ranks() != kWorld) throw lockstep::Error("active_ranks() after the loop");
  for (const Tensor& p : model->parameters()) out.params.push_back(p.detach().clone());
  for (const Tensor& b : model->buffers()) out.buffers.push_back(b.detach().clone());
  return out;
}

std::vector<RankResult> train_joined(const Config& c) {
  std::vector<RankResult> results(kWorld);
  const auto problems = lt::on_ranks(kWorld, [&](int r, auto group) -> std::string {
    results[static_cast<size_t>(r)] = train_rank(r, group, c);
    return "";
  }, "join");
  for (size_t r = 0; r < problems.size(); ++r) {
    INFO("rank " << r);
    REQUIRE(problems[r] == "");
  }
  return results;
}

// One process: at iteration t, the ranks with more than t batches are active;
// SyncBatchNorm's run is BatchNorm over their concatenated batches, the
// per-rank BatchNorm's the sum of their separate losses, each divided as
// DDP divides (by the active ranks, or by the world size).
RankResult train_reference(const Config& c) {
  auto model = make_model(std::make_shared<nn::BatchNorm1d>(8));
  auto opt = make_sgd(model->parameters());
  for (int64_t t = 0; t < kSteps; ++t) {
    std::vector<int> active;
    for (int r = 0; r < kWorld; ++r)
      if (kShardBatches[static_cast<size_t>(r)] > t) active.push_back(r);
    const double a = static_cast<double>(active.size());
    const double divisor = c.divide_by_initial_world_size ? kWorld : a;
    auto rows_of = [&](int r) {
      std::vector<int64_t> rows;
      for (int64_t i = 0; i < kBatch; ++i) rows.push_back((first_batch(r) + t) * kBatch + i);
      return rows;
    };
    opt->zero_grad();
    Tensor loss;
    if (c.sync_bn) {
      std::vector<int64_t> rows;
      for (int r : active) {
        const auto mine = rows_of(r);
        rows.insert(rows.end(), mine.begin(), mine.end());
      }
      const rt::Batch b = pool().get_batch(rows);
      // The mean over a*B samples is (1/a) * the sum of the ranks' means.
      loss = rt::mul(rt::cross_entropy(model->forward(b.x), b.y), a / divisor);
    } else {
      for (int r : active) {
        const rt::Batch b = pool().get_batch(rows_of(r));
        Tensor l = rt::mul(rt::cross_entropy(model->forward(b.x), b.y), 1.0 / divisor);
        loss = loss.defined() ? rt::add(loss, l) : l;
      }
    }
    loss.backward();
    opt->step();
  }
  RankResult out;
  for (const Tensor& p : model->parameters()) out.params.push_back(p.detach().clone());
  for (const Tensor& b : model->buffers()) out.buffers.push_back(b.detach().clone());
  return out;
}

// Every rank bitwise equal to rank 0, and rank 0 within `tol` of the reference.
void check_against_reference(const std::vector<RankResult>& ranks, const RankResult& ref,
                             double tol, bool buffers) {
  for (int r = 1; r < kWorld; ++r) {
    for (size_t i = 0; i < ref.params.size(); ++i) {
      INFO("rank " << r << ", parameter " << i);
      CHECK(lt::bitwise_equal(ranks[static_cast<size_t>(r)].params[i], ranks[0].params[i]));
    }
  }
  for (size_t i = 0; i < ref.params.size(); ++i)
    CHECK(lt::mismatch(fmt::format("parameter {}", i), ranks[0].params[i], ref.params[i], tol) ==
          "");
  if (!buffers) return;
  for (int r = 0; r < kWorld; ++r) {
    for (size_t i = 0; i < ref.buffers.size(); ++i) {
      INFO("rank " << r);
      CHECK(lt::mismatch(fmt::format("buffer {}", i), ranks[static_cast<size_t>(r)].buffers[i],
                         ref.buffers[i], tol) == "");
    }
  }
}

// f32 rounding: the ranks sum their gradients in another order than one
// process does, over 7 steps of SGD with momentum (they agree to about 1e-7
// relative; 1e-6 passes, 1e-7 does not).
constexpr double kTol = 1e-5;

}  // namespace

TEST_CASE("Join: 3 ranks of 2, 4 and 7 batches, SyncBatchNorm + DDP + SGD, equal the one-process "
          "run on the active ranks' batches",
          "[ddp][join]") {
  const Config c{.sync_bn = true};
  const auto ranks = train_joined(c);
  for (int r = 0; r < kWorld; ++r) {
    const RankResult& mine = ranks[static_cast<size_t>(r)];
    INFO("rank " << r);
    CHECK(mine.active == std::vector<int>{3, 3, 2, 2, 1, 1, 1});
    REQUIRE(mine.joined.size() == static_cast<size_t>(kSteps));
    for (int64_t t = 0; t < kSteps; ++t) {
      const bool joined = t >= kShardBatches[static_cast<size_t>(r)];
      CHECK(mine.joined[static_cast<size_t>(t)] == joined);
      if (joined) CHECK(mine.losses[static_cast<size_t>(t)] == 0.0);  // an empty batch's loss
    }
  }
  // Running statistics too: SyncBatchNorm's global ones are BatchNorm's over
  // the concatenation, and num_batches_tracked counts all 7 steps.
  check_against_reference(ranks, train_reference(c), kTol, true);
}

TEST_CASE("Join: per-rank BatchNorm + DDP + SGD equals the one-process run", "[ddp][join]") {
  const Config c{.sync_bn = false};
  // Buffers differ by design: each rank's running statistics are its own.
  check_against_reference(train_joined(c), train_reference(c), kTol, false);
}

TEST_CASE("Join: SyncBatchNorm + DDP + ZeroRedundancyOptimizer equals the one-process run",
          "[ddp][join][zero]") {
  const Config c{.sync_bn = true, .zero = true};
  check_against_reference(train_joined(c), train_reference(c), kTol, true);
}

TEST_CASE("Join: per-rank BatchNorm + DDP + ZeroRedundancyOptimizer equals the one-process run",
          "[ddp][join][zero]") {
  const Config c{.sync_bn = false, .zero = true};
  check_against_reference(train_joined(c), train_reference(c), kTol, false);
}

TEST_CASE("Join: divide_by_initial_world_size divides by the world size, as PyTorch",
          "[ddp][join]") {
  const Config c{.sync_bn = true, .divide_by_initial_world_size = true};
  const auto ranks = train_joined(c);
  check_against_reference(ranks, train_reference(c), kTol, true);
  // And that is not the default's result.
  const RankResult other = train_reference(Config{.sync_bn = true});
  CHECK(lt::mismatch("parameter 0", ranks[0].params[0], other.params[0], 1e-3) != "");
}

TEST_CASE("Join: with an fp16 compression hook ranks stay bitwise equal, near the reference",
          "[ddp][join]") {
  const Config c{.sync_bn = true, .hook = nn::comm_hooks::fp16_compress()};
  check_against_reference(train_joined(c), train_reference(Config{.sync_bn = true}), 2e-3,
                          false);
}

TEST_CASE("Join: without it, the same uneven run fails on every rank that goes on, at once",
          "[ddp][join]") {
  // What Join prevents: rank 0 leaves after 2 batches and, as an evaluation
  // loop does, all-reduces its totals while the others are in DDP's next
  // all-reduce: a collective mismatch, or a timeout (2 s here), not a hang.
  const auto groups = lt::make_groups(lt::kThreadRankBackend, kWorld, "nojoin",
                                      std::chrono::seconds(2));
  std::vector<std::string> problems(kWorld);
  const auto errors = lt::run_ranks(kWorld, [&](int r) {
    const auto& group = groups[static_cast<size_t>(r)];
    auto model = make_model(std::make_shared<nn::SyncBatchNorm>(8, group));
    nn::DistributedDataParallel ddp(model, group);
    auto opt = make_sgd(model->parameters());
    const rt::TensorDataset data = shard_of(r);
    rt::DataLoader loader(data, {.batch_size = kBatch});
    for (const rt::Batch& b : loader) {
      opt->zero_grad();
      rt::cross_entropy(ddp.forward(b.x), b.y).backward();
      opt->step();
    }
    Tensor totals = Tensor::from_vector<int64_t>({1, 2}, {2});
    group->allreduce(totals)->wait();
  });
  for (int r = 1; r < kWorld; ++r) {  // ranks 1 and 2 had more batches
    const std::string message = lt::message_of(errors[static_cast<size_t>(r)]);
    INFO("rank " << r << ": " << message);
    CHECK((Catch::Contains("differs across the ranks").match(message) ||
           Catch::Contains("timed out").match(message)));
  }
}

TEST_CASE("Join: a second Join on the same group, or ranks with different sample shapes, are "
          "refused with a clear error",
          "[ddp][join]") {
  const auto problems = lt::on_ranks(kWorld, [](int r, auto group) -> std::string {
    std::string out;
    {
      nn::Join join(*group);
      out += lt::error_of([&] { nn::Join again(*group); });
      if (nn::Join::current(*group) != &join) out += " [current() is not the live Join]";
    }
    if (nn::Join::current(*group) != nullptr) out += " [current() after the Join ended]";
    nn::Join join(*group);  // the first is gone: allowed again
    // Rank 2's samples have 5 features, the others' 6.
    const int64_t features = r == 2 ? 5 : 6;
    const rt::TensorDataset data(Tensor::zeros({8, features}), Tensor::zeros({8}, rt::DType::i64));
    rt::DataLoader loader(data, {.batch_size = 4});
    out += " | " + lt::error_of([&] {
      for (const rt::Batch& b : join.batches(loader)) (void)b;
    });
    return out;
  }, "join_misuse");
  for (const std::string& p : problems) {
    INFO(p);
    CHECK_THAT(p, Catch::Contains("another Join over this process group") &&
                      Catch::Contains("samples of different shapes or dtypes") &&
                      Catch::Contains("rank 0: x [6] f32, y [] i64") &&
                      Catch::Contains("rank 2: x [5] f32, y [] i64"));
    CHECK_THAT(p, !Catch::Contains("[current()"));
  }
}

TEST_CASE("Join: ranks with 0, 1 and 3 batches, and a fresh pass per epoch", "[ddp][join]") {
  const auto problems = lt::on_ranks(kWorld, [](int r, auto group) -> std::string {
    const int64_t batches = std::vector<int64_t>{0, 1, 3}[static_cast<size_t>(r)];
    const rt::TensorDataset data(Tensor::ones({batches * 2, 3}),
                                 Tensor::zeros({batches * 2}, rt::DType::i64));
    rt::DataLoader loader(data, {.batch_size = 2});
    nn::Join join(*group);
    std::string out;
    for (int epoch = 0; epoch < 2; ++epoch) {
      loader.set_epoch(epoch);
      int64_t iterations = 0, samples = 0;
      for (const rt::Batch& b : join.batches(loader)) {
        ++iterations;
        samples += b.size();
        if (b.x.shape() != rt::Shape{b.size(), 3}) out += " [x of another shape]";
        // Everyone's collective, whatever the batch: a sum of the samples.
        Tensor n = Tensor::from_vector<int64_t>({b.size()}, {1});
        group->allreduce(n)->wait();
        if (n.item() != 2 * join.active_ranks()) out += " [sum of samples]";
      }
      if (iterations != 3 || samples != batches * 2) {
        out += fmt::format(" [epoch {}: {} iterations, {} samples]", epoch, iterations, samples);
      }
    }
    return out;
  }, "join_small");
  for (const std::string& p : problems) CHECK(p == "");
}
