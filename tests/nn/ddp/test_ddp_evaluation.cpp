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
  const auto global = lt::global_batch(16, 6);
  const auto groups = lt::make_groups(lt::kThreadRankBackend, 2, "ddp-eval",
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
