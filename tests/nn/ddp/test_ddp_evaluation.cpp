// DDP in evaluation: no collective, whichever of the wrapper or the wrapped
// module was put in eval mode, so ranks may evaluate different numbers of
// batches; in-process over gloo (or shm).
#include <catch2/catch.hpp>

#include <chrono>

#include "lockstep/nn/normalization.h"
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
