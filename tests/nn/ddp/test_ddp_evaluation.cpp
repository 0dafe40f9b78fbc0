// DDP in evaluation: no collective, whichever of the wrapper or the wrapped
// module was put in eval mode, so ranks may evaluate different numbers of
// batches; in-process over gloo (or shm).
#include <catch2/catch.hpp>

#include <chrono>

#include "lockstep/nn/normalization.h"
#include "lockstep/nn/sync_batch_norm.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "nn/ddp/ddp_fixture.h"
#include "support/test_util.h"

namespace lt = lockstep::testing;
namespace nn = lockstep::nn;
using lockstep::nn::DdpOptions;
using lockstep::nn::DistributedDataParallel;
using lockstep::runtime::Tensor;

TEST_CASE("DDP: a wrapped module put in eval mode by itself evaluates without collectives",
          "[ddp]") {
  // As ddp.eval(): model->eval() on the module that was wrapped (the handle
  // a training script keeps) stops the buffer broadcast and verify_every's
  // check, so rank 0 evaluating three batches while rank 1 evaluates one
  // neither waits for rank 1 (2 s timeout) nor takes rank 0's statistics.
  // ddp.eval() on the wrapper reaches the wrapped module alike.
  const bool via_wrapper = GENERATE(false, true);
  const auto global = lt::global_batch(16, 6);
  const auto groups = lt::make_groups(lt::kThreadRankBackend, 2,
                                      via_wrapper ? "ddp-eval-wrapper" : "ddp-eval",
                                      std::chrono::seconds(2));
  std::vector<std::string> problems(2);
  const auto errors = lt::run_ranks(2, [&](int r) {
    auto model = std::make_shared<nn::Sequential>();
    model->push_back(std::make_shared<nn::BatchNorm1d>(12));
    model->push_back(std::make_shared<nn::Linear>(12, 5));
    DistributedDataParallel ddp(model, groups[static_cast<size_t>(r)],
                                DdpOptions{.verify_every = 1});
    const auto local = lt::shard(global, r, 2);
    lt::loss_of(ddp, local).backward();  // the ranks' running statistics now differ
    if (via_wrapper)
      ddp.eval();
    else
      model->eval();
    lockstep::runtime::NoGradGuard no_grad;
    for (int i = 0; i < (r == 0 ? 3 : 1); ++i) {
      const Tensor want = model->forward(local.x);
      const Tensor got = ddp.forward(local.x);
      if (!lt::bitwise_equal(got, want)) {
        problems[static_cast<size_t>(r)] = fmt::format("forward {} differs from the model's", i);
        return;
      }
    }
  });
  for (int r = 0; r < 2; ++r) {
    if (errors[static_cast<size_t>(r)])
      problems[static_cast<size_t>(r)] = lt::message_of(errors[static_cast<size_t>(r)]);
  }
  CHECK(lt::joined(problems) == "");
}

TEST_CASE("DDP: a train-mode forward on rank 0 alone fails naming the collective of DDP or "
          "SyncBatchNorm it started, and says to evaluate in eval mode",
          "[ddp][syncbn]") {
  // The forum's hang: validation on rank 0 with the model left in train
  // mode, while rank 1 goes on to the all-reduce of the metric. The two
  // calls differ, so both ranks fail at once; rank 0's error must say which
  // forward collective it was in and what to do, not only "collective #11
  // differs" about a broadcast it never called.
  const bool sync_bn = GENERATE(false, true);
  const auto global = lt::global_batch(16, 6);
  const auto groups = lt::make_groups(lt::kThreadRankBackend, 2,
                                      sync_bn ? "ddp-alone-syncbn" : "ddp-alone",
                                      std::chrono::seconds(60));
  const auto errors = lt::run_ranks(2, [&](int r) {
    const auto& group = groups[static_cast<size_t>(r)];
    auto model = std::make_shared<nn::Sequential>();
    model->push_back(std::make_shared<nn::Linear>(12, 12));
    model->push_back(std::make_shared<nn::BatchNorm1d>(12));
    model->push_back(std::make_shared<nn::Linear>(12, 5));
    std::shared_ptr<nn::Module> wrapped = model;
    if (sync_bn) wrapped = nn::convert_sync_batchnorm(model, group);
    DistributedDataParallel ddp(wrapped, group, DdpOptions{.broadcast_buffers = !sync_bn});
    lt::loss_of(ddp, lt::shard(global, r, 2)).backward();
    lockstep::runtime::NoGradGuard no_grad;
    if (r == 0) (void)ddp.forward(global.x);
    Tensor metric = Tensor::from_vector<int64_t>({3, 8}, {2});
    group->allreduce(metric, {.op = lockstep::collectives::ReduceOp::Sum})->wait();
  });
  REQUIRE(errors[0]);
  REQUIRE(errors[1]);  // its all-reduce met rank 0's forward collective
  const std::string message = lt::message_of(errors[0]);
  INFO(message);
  CHECK_THROWS_AS(std::rethrow_exception(errors[0]), lockstep::collectives::CollectiveMismatch);
  CHECK_THAT(message, Catch::Contains(sync_bn ? "SyncBatchNorm on rank 0: the all-gather"
                                              : "DistributedDataParallel on rank 0: the "
                                                "broadcast of the module's buffers"));
  CHECK_THAT(message, Catch::Contains("put the model in eval mode first"));
}

TEST_CASE("DDP: an evaluation with grad mode on, on rank 0 only, leaves the gradients of the "
          "no_sync() accumulation that follows right on every rank",
          "[ddp]") {
  // Validation on rank 0 through the DDP model in eval mode, NoGradGuard
  // forgotten, its outputs dropped; then every rank accumulates over two
  // micro-batches, the first under no_sync(). The evaluation's forward can
  // never be backpropagated, so it must not turn rank 0's no_sync() backward
  // into an averaged one: that all-reduce would meet rank 1's averaged
  // backward (wrong gradients there) and leave rank 0's waiting.
  const auto first = lt::global_batch(8, 51), second = lt::global_batch(8, 52);
  auto ref = lt::small_mlp(4);
  lt::loss_of(*ref, first).backward();
  lt::loss_of(*ref, second).backward();
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    auto model = lt::small_mlp(4);
    DistributedDataParallel ddp(model, group);
    if (r == 0) {
      ddp.eval();
      for (int i = 0; i < 2; ++i) (void)ddp.forward(first.x);
      ddp.train();
    }
    {
      auto no_sync = ddp.no_sync();
      lt::loss_of(ddp, lt::shard(first, r, 2)).backward();
    }
    if (ddp.stats().synced) return "the no_sync() backward was averaged";
    lt::loss_of(ddp, lt::shard(second, r, 2)).backward();
    if (!ddp.stats().synced) return "the last backward was not averaged";
    const auto got = model->named_parameters(), want = ref->named_parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      auto problem = lt::mismatch(got[i].first, got[i].second.grad(), want[i].second.grad(), 1e-5);
      if (!problem.empty()) return problem;
    }
    return "";
  }, "ddp-eval-rank0-grad");
  CHECK(lt::joined(problems) == "");
}
