#include "lockstep/collectives/backend_choice.h"

#include <map>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lockstep/runtime/error.h"

namespace lockstep::collectives {
namespace {

std::string rank_list(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

}  // namespace

BackendChoice choose_default_backend(const std::vector<RankPlacement>& ranks, bool nccl_built) {
  LOCKSTEP_CHECK(!ranks.empty(), "choose_default_backend: no ranks");
  std::set<std::string> nodes;
  std::vector<int> on_cpu, on_gpu;
  // (node, GPU index) -> the ranks on it.
  std::map<std::pair<std::string, int>, std::vector<int>> gpu_users;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    const RankPlacement& p = ranks[static_cast<size_t>(r)];
    nodes.insert(p.node);
    if (p.device.is_cuda()) {
      on_gpu.push_back(r);
      gpu_users[{p.node, p.device.index}].push_back(r);
    } else {
      on_cpu.push_back(r);
    }
  }
  const std::string host_backend = nodes.size() == 1 ? "shm" : "shm+gloo";
  if (on_gpu.empty()) return {host_backend, {}};
  LOCKSTEP_CHECK(on_cpu.empty(),
                 "{} compute{} on the CPU and {} on GPUs; one group needs one kind: give every "
                 "rank a GPU, or run every rank on the CPU (--device cpu, LOCKSTEP_DEVICE=cpu)",
                 rank_list(on_cpu), on_cpu.size() == 1 ? "s" : "", rank_list(on_gpu));

  for (const auto& [gpu, users] : gpu_users) {
    if (users.size() < 2) continue;
    return {host_backend,
            fmt::format("{} share cuda:{}{}, and NCCL needs one GPU per rank: collectives go "
                        "over {} with CUDA tensors staged through host memory",
                        rank_list(users), gpu.second, nodes.size() == 1 ? "" : " of one node",
                        host_backend)};
  }
  if (!nccl_built)
    return {host_backend,
            fmt::format("this build of lockstep has no NCCL: collectives go over {} with CUDA "
                        "tensors staged through host memory",
                        host_backend)};
  return {"nccl", {}};
}

}  // namespace lockstep::collectives
