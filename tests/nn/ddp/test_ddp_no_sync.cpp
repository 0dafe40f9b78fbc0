// DDP's no_sync(), in-process over gloo: local accumulation that the next
// averaged backward averages, a no_sync() forward behind an ordinary one (its
// backward stays averaged, as PyTorch), and a second backward through an
// averaged loss refused.
#include <catch2/catch.hpp>

#include "nn/ddp/ddp_fixture.h"

namespace lt = lockstep::testing;
using lockstep::nn::DdpOptions;
using lockstep::nn::DistributedDataParallel;
using lockstep::runtime::Tensor;

namespace {

// Float sums in a different order (per-rank means, then the all-reduce)
// differ from the one-process mean in the last bits: 1e-5 relative.
constexpr double kTol = 1e-5;

// "" when every parameter's .grad of `module` is within kTol of the .grad of
// the same parameter (in order) of `reference`; else the first that is not.
std::string grads_differ(const lockstep::nn::Module& module, const lockstep::nn::Module& reference,
                         const std::string& when = "") {
  const auto mine = module.named_parameters();
  const auto theirs = reference.parameters();
  for (size_t i = 0; i < mine.size(); ++i) {
    auto problem =
        lt::mismatch(when + mine[i].first, mine[i].second.grad(), theirs[i].grad(), kTol);
    if (!problem.empty()) return problem;
  }
  return "";
}

// The losses of a forward outside no_sync() on `a`, then of one under it on `b`.
std::pair<Tensor, Tensor> synced_then_not(DistributedDataParallel& ddp, const lt::Batch& a,
                                          const lt::Batch& b) {
  const Tensor first = lt::loss_of(ddp, a);
  auto guard = ddp.no_sync();
  return {first, lt::loss_of(ddp, b)};
}

// Their mean: one loss over both forwards.
Tensor mean_of(const Tensor& a, const Tensor& b) {
  return lockstep::runtime::mul(lockstep::runtime::add(a, b), 0.5);
}

}  // namespace

TEST_CASE("DDP: no_sync accumulates locally and the next backward averages the sum", "[ddp]") {
  const int size = 2;
  const auto first = lt::global_batch(8, 21), second = lt::global_batch(8, 22);
  // Reference: one process, both global batches, each loss halved (= the mean
  // over the 16 samples of both).
  auto ref = lt::small_mlp(1);
  lockstep::runtime::mul(lt::loss_of(*ref, first), 0.5).backward();
  lockstep::runtime::mul(lt::loss_of(*ref, second), 0.5).backward();
  const auto problems = lt::on_ranks(size, [&](int r, auto group) -> std::string {
    auto ddp = std::make_shared<DistributedDataParallel>(lt::small_mlp(1), group);
    {
      auto guard = ddp->no_sync();
      lockstep::runtime::mul(lt::loss_of(*ddp, lt::shard(first, r, size)), 0.5).backward();
      if (ddp->stats().synced) return "a no_sync iteration reported communication";
    }
    lockstep::runtime::mul(lt::loss_of(*ddp, lt::shard(second, r, size)), 0.5).backward();
    return grads_differ(ddp->module(), *ref);
  });
  REQUIRE(lt::joined(problems).empty());
}

// As PyTorch, whose no_sync() forward skips prepare_for_backward: the averaging
// that an ordinary forward armed stays armed through a forward under the guard
// (a GAN-style loss over a real and a generated batch, the second forward under
// no_sync). Before, the second forward disarmed it: the backward of the summed
// loss accumulated locally on each rank and the replicas drifted apart.
TEST_CASE("DDP: a no_sync forward after an ordinary one leaves its backward averaged",
          "[ddp]") {
  const int size = 2;
  const auto first = lt::global_batch(8, 31), second = lt::global_batch(8, 32);
  auto ref = lt::small_mlp(3);
  mean_of(lt::loss_of(*ref, first), lt::loss_of(*ref, second)).backward();
  const DdpOptions options = GENERATE(DdpOptions{}, DdpOptions{.find_unused_parameters = true},
                                      DdpOptions{.gradient_as_bucket_view = true});
  const auto problems = lt::on_ranks(size, [&](int r, auto group) -> std::string {
    auto ddp = std::make_shared<DistributedDataParallel>(lt::small_mlp(3), group, options);
    const auto [a, b] =
        synced_then_not(*ddp, lt::shard(first, r, size), lt::shard(second, r, size));
    mean_of(a, b).backward();
    if (!ddp->stats().synced) return "the backward of both forwards was not averaged";
    return grads_differ(ddp->module(), *ref);
  });
  INFO(lt::joined(problems));
  REQUIRE(lt::joined(problems).empty());
}

// A forward whose outputs are dropped (predictions taken with grad mode on)
// between the two: the first forward's loss still lives, so the averaging it
// armed stays armed for the no_sync forward, as without the dropped one.
TEST_CASE("DDP: a no_sync forward after an ordinary one and a dropped one leaves its backward "
          "averaged",
          "[ddp]") {
  const int size = 2;
  const auto first = lt::global_batch(8, 31), second = lt::global_batch(8, 32);
  auto ref = lt::small_mlp(3);
  mean_of(lt::loss_of(*ref, first), lt::loss_of(*ref, second)).backward();
  const auto problems = lt::on_ranks(size, [&](int r, auto group) -> std::string {
    auto ddp = std::make_shared<DistributedDataParallel>(lt::small_mlp(3), group);
    const Tensor a = lt::loss_of(*ddp, lt::shard(first, r, size));
    (void)ddp->forward(lt::shard(second, r, size).x);
    Tensor b;
    {
      auto guard = ddp->no_sync();
      b = lt::loss_of(*ddp, lt::shard(second, r, size));
    }
    mean_of(a, b).backward();
    if (!ddp->stats().synced) return "the backward of both forwards was not averaged";
    return grads_differ(ddp->module(), *ref);
  });
  REQUIRE(lt::joined(problems).empty());
}

// Separate backward passes: the first is averaged, the second accumulates
// locally (as PyTorch, where the first backward ends the armed iteration) and
// the next averaged backward averages it.
TEST_CASE("DDP: after a no_sync forward behind an ordinary one, the first backward averages "
          "and the second accumulates",
          "[ddp]") {
  const int size = 2;
  const auto first = lt::global_batch(8, 41), second = lt::global_batch(8, 42);
  const auto third = lt::global_batch(8, 43);
  auto ref = lt::small_mlp(4);
  for (const auto* batch : {&first, &second, &third}) lt::loss_of(*ref, *batch).backward();
  const auto problems = lt::on_ranks(size, [&](int r, auto group) -> std::string {
    auto ddp = std::make_shared<DistributedDataParallel>(lt::small_mlp(4), group);
    const auto [a, b] =
        synced_then_not(*ddp, lt::shard(first, r, size), lt::shard(second, r, size));
    a.backward();
    if (!ddp->stats().synced) return "the first backward was not averaged";
    b.backward();
    // The whole first batch's gradient plus this rank's share of the second.
    auto local = lt::small_mlp(4);
    lt::loss_of(*local, first).backward();
    lt::loss_of(*local, lt::shard(second, r, size)).backward();
    auto problem = grads_differ(ddp->module(), *local, "after the second backward, ");
    if (!problem.empty()) return problem;
    lt::loss_of(*ddp, lt::shard(third, r, size)).backward();
    return grads_differ(ddp->module(), *ref);
  });
  INFO(lt::joined(problems));
  REQUIRE(lt::joined(problems).empty());
}

// After the averaged backward of one loss over both forwards, the no_sync()
// forward's local accumulation waits for a backward of its own. Before, a
// second backward through that loss's retained graph (or through either
// forward's output) was taken as that backward: it added both forwards'
// gradients again, unaveraged, without a word.
TEST_CASE("DDP: a second backward through a loss over a forward and a no_sync forward, once "
          "averaged, is refused; a new no_sync forward still accumulates",
          "[ddp]") {
  const int size = 2;
  const auto first = lt::global_batch(8, 51), second = lt::global_batch(8, 52);
  const int again = GENERATE(0, 1, 2);  // the whole loss, the averaged forward, the no_sync one
  INFO("backward again through " << (again == 0 ? "the loss" : again == 1 ? "a" : "b"));
  const auto problems = lt::on_ranks(size, [&](int r, auto group) -> std::string {
    auto ddp = std::make_shared<DistributedDataParallel>(lt::small_mlp(5), group);
    const auto [a, b] =
        synced_then_not(*ddp, lt::shard(first, r, size), lt::shard(second, r, size));
    const Tensor loss = lockstep::runtime::add(a, b);
    loss.backward({}, /*retain_graph=*/true);
    if (!ddp->stats().synced) return "the backward of both forwards was not averaged";
    const Tensor& twice = again == 0 ? loss : again == 1 ? a : b;
    try {
      twice.backward();
      return "a second backward through the averaged loss was taken";
    } catch (const lockstep::Error& e) {
      if (!Catch::Contains("already went through").match(e.what()))
        return fmt::format("unexpected error: {}", e.what());
    }
    // A no_sync() forward of its own accumulates locally, and the next
    // averaged backward averages it.
    {
      auto guard = ddp->no_sync();
      lt::loss_of(*ddp, lt::shard(second, r, size)).backward();
    }
    if (ddp->stats().synced) return "the no_sync backward was averaged";
    lt::loss_of(*ddp, lt::shard(first, r, size)).backward();
    return ddp->stats().synced ? "" : "the last backward was not averaged";
  });
  INFO(lt::joined(problems));
  REQUIRE(lt::joined(problems).empty());
}
