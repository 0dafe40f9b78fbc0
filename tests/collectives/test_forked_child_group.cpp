// A child forked after a group was made (a data-loading worker, an
// evaluator) that calls a collective on its parent's group: refused with a
// clear error (also through DDP), and the parent's ranks go on undisturbed.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "collectives/rank_threads.h"
#include "lockstep/collectives/backends.h"
#include "lockstep/collectives/shared_pool.h"
#include "lockstep/collectives/work.h"
#include "lockstep/nn/linear.h"
#include "nn/ddp/ddp_fixture.h"
#include "support/backend_skip.h"
#include "support/forked_child.h"
#include "support/test_util.h"

namespace lc = lockstep::collectives;
namespace lt = lockstep::testing;
using lockstep::runtime::Tensor;
namespace nn = lockstep::nn;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

namespace {

// Two ranks' groups of `backend` after a first all-reduce, so that the
// backend's threads and connections are up before a test forks.
std::vector<std::shared_ptr<lc::ProcessGroup>> warmed_up_groups(const std::string& backend,
                                                               const std::string& name,
                                                               std::chrono::seconds timeout) {
  auto groups = lt::make_groups(backend, 2, name, timeout);
  lt::run_ranks(2, [&](int r) {
    Tensor t = Tensor::ones({4});
    groups[static_cast<size_t>(r)]->allreduce(t)->wait();
  });
  return groups;
}

}  // namespace

TEST_CASE("every CPU backend: a collective on the parent's group in a forked child is refused, "
          "and the parent's ranks go on",
          "[collectives][lifecycle][fork]") {
  const std::string backend = GENERATE(from_range(lt::cpu_backends_and_hierarchical()));
  INFO(backend);
  auto groups = warmed_up_groups(backend, "forked-use", 20s);
  const std::string error = lt::error_in_forked_child([&] {
    Tensor t = Tensor::ones({4});
    groups[0]->allreduce(t)->wait();
  });
  CHECK_THAT(error, Contains("allreduce on group 'forked-use'") &&
                        Contains("forked") && Contains("init_process_group"));
  // The child numbered nothing and sent nothing: the parent's ranks agree.
  std::vector<float> sums(2);
  const auto errors = lt::run_ranks(2, [&](int r) {
    Tensor t = Tensor::ones({4});
    groups[static_cast<size_t>(r)]->allreduce(t)->wait();
    sums[static_cast<size_t>(r)] = t.data_ptr<float>()[0];
  });
  CHECK(lt::message_of(errors[0]) == "<no exception>");
  CHECK(lt::message_of(errors[1]) == "<no exception>");
  CHECK(sums == std::vector<float>{2.0f, 2.0f});
}

TEST_CASE("every CPU backend: a forked child that aborts its parent's group aborts only its own "
          "copy",
          "[collectives][lifecycle][fork]") {
  // The other ranks are the parent's peers: telling them the group is
  // unusable would fail the parent's job.
  const std::string backend = GENERATE(from_range(lt::cpu_backends_and_hierarchical()));
  INFO(backend);
  auto groups = warmed_up_groups(backend, "forked-abort", 20s);
  const std::string error = lt::error_in_forked_child([&] {
    groups[0]->abort("the child gave up");
    Tensor t = Tensor::ones({4});
    groups[0]->allreduce(t)->wait();
  });
  CHECK_THAT(error, Contains("forked"));
  std::vector<float> sums(2);
  const auto errors = lt::run_ranks(2, [&](int r) {
    Tensor t = Tensor::ones({4});
    groups[static_cast<size_t>(r)]->allreduce(t)->wait();
    sums[static_cast<size_t>(r)] = t.data_ptr<float>()[0];
  });
  CHECK(lt::message_of(errors[0]) == "<no exception>");
  CHECK(lt::message_of(errors[1]) == "<no exception>");
  CHECK(sums == std::vector<float>{2.0f, 2.0f});
}

TEST_CASE("every CPU backend: reserving a shared pool on the parent's group in a forked child "
          "is refused, and the parent's ranks reserve one together",
          "[collectives][lifecycle][fork]") {
  // A pool is joined through the group's store and its worker thread, both
  // the parent's: the child waited for peers that were not its own.
  const std::string backend = GENERATE(from_range(lt::cpu_backends_and_hierarchical()));
  INFO(backend);
  auto groups = warmed_up_groups(backend, "forked-pool", 20s);
  const std::string error =
      lt::error_in_forked_child([&] { groups[0]->reserve_shared_pool(4096); });
  CHECK_THAT(error, Contains("reserve_shared_pool on group 'forked-pool'") &&
                        Contains("forked") && Contains("init_process_group"));
  std::vector<float> sums(2);
  const auto errors = lt::run_ranks(2, [&](int r) {
    auto& group = groups[static_cast<size_t>(r)];
    auto pool = group->reserve_shared_pool(4096);
    Tensor t = pool != nullptr ? pool->empty({4}, lockstep::runtime::DType::f32) : Tensor::ones({4});
    t.fill_(1.0f);
    group->allreduce(t)->wait();
    sums[static_cast<size_t>(r)] = t.data_ptr<float>()[0];
  });
  CHECK(lt::message_of(errors[0]) == "<no exception>");
  CHECK(lt::message_of(errors[1]) == "<no exception>");
  CHECK(sums == std::vector<float>{2.0f, 2.0f});
}

TEST_CASE("every CPU backend: a collective in flight at a fork fails at once when the child "
          "waits for it, and completes in the parent",
          "[collectives][lifecycle][fork]") {
  // The collective runs on the parent's threads: before, the child's wait
  // lasted until the deadline (a DDP destroyed in a forked child with a
  // bucket in flight waited so too).
  const std::string backend = GENERATE(from_range(lt::cpu_backends_and_hierarchical()));
  INFO(backend);
  auto groups = warmed_up_groups(backend, "forked-wait", 30s);
  // Rank 0's all-reduce waits for rank 1's, which comes after the fork.
  Tensor mine = Tensor::ones({4});
  auto in_flight = groups[0]->allreduce(mine);
  const std::string error = lt::error_in_forked_child([&] { in_flight->wait(); });
  CHECK_THAT(error, Contains("allreduce") && Contains("forked from process") &&
                        Contains("in flight"));
  Tensor theirs = Tensor::ones({4});
  groups[1]->allreduce(theirs)->wait();
  in_flight->wait();
  CHECK(mine.data_ptr<float>()[0] == 2.0f);
  CHECK(theirs.data_ptr<float>()[0] == 2.0f);
  // One that had finished before the fork is waited for in the child as usual.
  CHECK(lt::error_in_forked_child([&] { in_flight->wait(); }) == "<no exception>");
}

TEST_CASE("DDP: a training step in a child forked from a rank is refused, naming the fork",
          "[ddp][fork]") {
  // A forked evaluator or data worker that steps the parent's DDP model
  // reaches the group through DDP's buffer broadcast and gradient buckets.
  const auto groups = lt::make_groups(lt::kThreadRankBackend, 2, "forked-ddp", 20s);
  const auto global = lt::global_batch(8, 3);
  std::vector<std::unique_ptr<nn::DistributedDataParallel>> ddps(2);
  lt::run_ranks(2, [&](int r) {
    auto model = std::make_shared<nn::Linear>(12, 5);
    ddps[static_cast<size_t>(r)] =
        std::make_unique<nn::DistributedDataParallel>(model, groups[static_cast<size_t>(r)]);
  });
  REQUIRE(ddps[0] != nullptr);
  const std::string error = lt::error_in_forked_child(
      [&] { lt::loss_of(*ddps[0], lt::shard(global, 0, 2)).backward(); });
  CHECK_THAT(error, Contains("group 'forked-ddp'") && Contains("forked"));
  const auto errors = lt::run_ranks(2, [&](int r) {
    lt::loss_of(*ddps[static_cast<size_t>(r)], lt::shard(global, r, 2)).backward();
  });
  CHECK(lt::message_of(errors[0]) == "<no exception>");
  CHECK(lt::message_of(errors[1]) == "<no exception>");
}
