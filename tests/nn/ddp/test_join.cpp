// nn::Join on three rank threads (the runs: nn/ddp/join_fixture.h; as real
// processes: test_join_processes.cpp): each rank bitwise equal, and equal to
// the one-process run over the active ranks' batches. Also the divisor
// option, compression hooks, misuse errors, and the same run without Join
// failing fast.
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "nn/ddp/join_fixture.h"
#include "support/test_util.h"

namespace lt = lockstep::testing;
using namespace lockstep::testing::join;

namespace {

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

TEST_CASE("Join: DDP refuses to train inside a Join over another group, whose joined ranks it "
          "would count in its divisor",
          "[ddp][join]") {
  // The same ranks in a second group object: the Join's all-reduce runs there.
  const auto others = lt::make_groups(lt::kThreadRankBackend, kWorld, "join_control",
                                      std::chrono::seconds(30));
  const auto problems = lt::on_ranks(kWorld, [&](int r, auto group) -> std::string {
    auto model = make_model(std::make_shared<nn::BatchNorm1d>(8));
    nn::DistributedDataParallel ddp(model, group);
    const rt::TensorDataset data = shard_of(r);
    rt::DataLoader loader(data, {.batch_size = kBatch});
    std::string out;
    {
      nn::Join join(*others[static_cast<size_t>(r)]);
      out = lt::error_of([&] {
        for (const rt::Batch& b : join.batches(loader))
          rt::cross_entropy(ddp.forward(b.x), b.y).backward();
      });
    }
    // Outside the loop, and in a Join over the model's own group, it trains.
    out += " | " + lt::error_of([&] { (void)ddp.forward(loader.batch(0).x); });
    model->zero_grad();
    nn::Join join(*group);
    out += " | " + lt::error_of([&] {
      for (const rt::Batch& b : join.batches(loader))
        rt::cross_entropy(ddp.forward(b.x), b.y).backward();
    });
    return out;
  }, "join_model");
  for (const std::string& p : problems) {
    INFO(p);
    CHECK_THAT(p, Catch::StartsWith("DistributedDataParallel on rank") &&
                      Catch::Contains("inside an nn::Join over group 'join_control") &&
                      Catch::EndsWith(" | <no exception> | <no exception>"));
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

TEST_CASE("Join: no_sync accumulation over iterations with different active ranks averages "
          "over every real batch; a forward that no backward follows counts for nothing",
          "[ddp][join]") {
  // Rank 0 holds 1 batch, rank 1 holds 2; both accumulate 2 iterations (the
  // first under no_sync, each loss / 2). Three real batches of 2 rows: the
  // average must be the one-process gradient on those 6 rows. The synced
  // iteration alone has 1 active rank; its count would make the result 1.5x.
  // With an evaluation forward (grad mode on, its loss dropped) before the
  // one under no_sync: it adds nothing to the sum of gradients, so it must
  // add no iteration to the mean of active ranks either: (2 + 1) / 2, not
  // (2 + 2 + 1) / 3.
  const bool evaluation_forward = GENERATE(false, true);
  CAPTURE(evaluation_forward);
  const lt::Batch global = lt::global_batch(6, 3);
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    const int64_t lo = r == 0 ? 0 : 2, hi = r == 0 ? 2 : 6;
    const rt::TensorDataset data(global.x.slice(0, lo, hi).contiguous(),
                                 global.y.slice(0, lo, hi).contiguous());
    rt::DataLoader loader(data, {.batch_size = 2});
    nn::DistributedDataParallel ddp(lt::small_mlp(1), group);
    nn::Join join(*group);
    int64_t i = 0;
    for (const rt::Batch& b : join.batches(loader)) {
      auto loss = [&] { return rt::mul(rt::cross_entropy(ddp.forward(b.x), b.y), 0.5); };
      if (i++ % 2 == 0) {
        auto guard = ddp.no_sync();
        if (evaluation_forward) (void)loss();  // evaluated, never differentiated
        loss().backward();
      } else {
        loss().backward();
      }
    }
    auto alone = lt::small_mlp(1);
    lt::loss_of(*alone, global).backward();
    const auto mine = ddp.module().named_parameters(), theirs = alone->named_parameters();
    for (size_t k = 0; k < mine.size(); ++k) {
      const auto m =
          lt::mismatch(mine[k].first, mine[k].second.grad(), theirs[k].second.grad(), kTol);
      if (!m.empty()) return m;
    }
    return "";
  }, evaluation_forward ? "join_accumulate_eval" : "join_accumulate");
  for (const std::string& p : problems) CHECK(p == "");
}

TEST_CASE("Join: DDP broadcasts per-rank BatchNorm statistics from a rank that still has data",
          "[ddp][join]") {
  // broadcast_buffers copies one rank's running statistics to every rank
  // before each forward. Once rank 0 has joined, its statistics stop
  // changing; copied from it, rank 1's update of every iteration would be
  // lost (PyTorch broadcasts from a rank that has not joined). BatchNorm
  // first, with the cumulative average: rank 1 must end with BatchNorm's
  // statistics over its own 3 batches, and rank 0 with those over rank 1's
  // first 2 (copied from rank 1 before its last update).
  const lt::Batch global = lt::global_batch(8, 9);
  auto make = [] {
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::BatchNorm1d>(12, nn::BatchNormOptions{.momentum = {}}));
    m->push_back(std::make_shared<nn::Linear>(12, 5));
    return m;
  };
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    const int64_t lo = r == 0 ? 0 : 2, hi = r == 0 ? 2 : 8;
    const rt::TensorDataset data(global.x.slice(0, lo, hi).contiguous(),
                                 global.y.slice(0, lo, hi).contiguous());
    rt::DataLoader loader(data, {.batch_size = 2});
    auto model = make();
    nn::DistributedDataParallel ddp(model, group);
    nn::Join join(*group);
    for (const rt::Batch& b : join.batches(loader)) {
      ddp.zero_grad();
      rt::cross_entropy(ddp.forward(b.x), b.y).backward();
    }
    auto alone = make();
    for (int64_t i = 2; i < (r == 0 ? 6 : 8); i += 2)
      (void)alone->forward(global.x.slice(0, i, i + 2).contiguous());
    const auto mine = model->named_buffers(), theirs = alone->named_buffers();
    for (size_t k = 0; k < mine.size(); ++k) {
      const auto m = lt::mismatch(mine[k].first, mine[k].second, theirs[k].second, 1e-6);
      if (!m.empty()) return m;
    }
    return "";
  }, "join_buffers");
  for (const std::string& p : problems) CHECK(p == "");
}
