#include "lockstep/collectives/backend_choice.h"

#include <algorithm>
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

std::string agreed_backend(const std::vector<std::string>& asked, const std::string& group) {
  LOCKSTEP_CHECK(!asked.empty(), "agreed_backend: no ranks");
  // Each backend asked for, in order of its lowest rank, with its ranks.
  std::vector<std::pair<std::string, std::vector<int>>> by_backend;
  for (int r = 0; r < static_cast<int>(asked.size()); ++r) {
    const std::string& b = asked[static_cast<size_t>(r)];
    auto it = std::find_if(by_backend.begin(), by_backend.end(),
                           [&](const auto& entry) { return entry.first == b; });
    if (it == by_backend.end()) it = by_backend.insert(by_backend.end(), {b, {}});
    it->second.push_back(r);
  }
  if (by_backend.size() == 1) return by_backend.front().first;
  std::vector<std::string> parts;
  for (const auto& [b, ranks] : by_backend) {
    parts.push_back(fmt::format("{}: {}", rank_list(ranks),
                                b.empty() ? std::string("the default (none asked for)") : b));
  }
  throw Error(fmt::format(
      "group '{}': the ranks ask for different backends: {}; set LOCKSTEP_BACKEND (or "
      "InitOptions::backend) alike on every rank, or on none",
      group, fmt::join(parts, "; ")));
}

}  // namespace lockstep::collectives
