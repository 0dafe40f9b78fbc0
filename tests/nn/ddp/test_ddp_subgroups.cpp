// DDP and ZeRO over groups from new_group(): replicas groups side by side in
// one job, each averaging over its own ranks only (PyTorch's
// DDP(process_group=...)), each stepping its own model.
#include <catch2/catch.hpp>

#include "lockstep/collectives/new_group.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/optim/zero_redundancy_optimizer.h"
#include "nn/ddp/ddp_fixture.h"

namespace lt = lockstep::testing;
namespace optim = lockstep::optim;
using lockstep::collectives::new_group;
using lockstep::runtime::Tensor;

namespace {

std::unique_ptr<optim::Optimizer> sgd(std::vector<optim::ParamGroup> groups) {
  return std::make_unique<optim::SGD>(std::move(groups), optim::SGDOptions{.lr = 0.1});
}

}  // namespace

TEST_CASE("DDP and ZeRO over two subgroups {0,1} and {2,3} work within each only",
          "[ddp][new_group]") {
  for (const std::string& backend : lt::cpu_backends()) {
    INFO(backend);
    // Each pair trains its own model on its own batch.
    const lt::Batch batches[2] = {lt::global_batch(8, 7), lt::global_batch(8, 8)};
    const uint64_t seeds[2] = {1, 2};
    std::vector<Tensor> expected[2], stepped[2];
    for (int pair = 0; pair < 2; ++pair) {
      auto model = lt::small_mlp(seeds[pair]);
      lt::loss_of(*model, batches[pair]).backward();
      for (const Tensor& p : model->parameters()) expected[pair].push_back(p.grad().clone());
      sgd({{model->parameters(), {}}})->step();
      for (const Tensor& p : model->parameters()) stepped[pair].push_back(p.clone());
    }
    const auto problems = lt::on_ranks(
        4,
        [&](int r, std::shared_ptr<lockstep::collectives::ProcessGroup> parent) -> std::string {
          auto low = new_group(*parent, {0, 1});
          auto high = new_group(*parent, {2, 3});
          const int pair = r < 2 ? 0 : 1;
          auto group = pair == 0 ? low : high;
          // The pair's rank 0 holds the pair's model; DDP broadcasts it to the other.
          const uint64_t seed = group->rank() == 0 ? seeds[pair] : 100 + r;
          lt::DistributedDataParallel ddp(lt::small_mlp(seed), group);
          optim::ZeroRedundancyOptimizer zero(ddp.module().parameters(), group, sgd);
          lt::loss_of(ddp, lt::shard(batches[pair], group->rank(), 2)).backward();
          const auto params = ddp.module().named_parameters();
          for (size_t i = 0; i < params.size(); ++i) {
            auto problem = lt::mismatch(params[i].first, params[i].second.grad(),
                                        expected[pair][i], 1e-5);
            if (!problem.empty()) return problem;
          }
          zero.step();
          for (size_t i = 0; i < params.size(); ++i) {
            auto problem = lt::mismatch("stepped " + params[i].first, params[i].second,
                                        stepped[pair][i], 1e-5);
            if (!problem.empty()) return problem;
          }
          return "";
        },
        "default", backend);
    CHECK(lt::joined(problems).empty());
  }
}
