#include "lockstep/collectives/backend_choice.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lockstep/collectives/build_identity.h"
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
  // Each GPU user's identity counts only where every GPU user has one: an
  // index is the same GPU only among ranks that see the same devices.
  const bool by_identity = std::all_of(ranks.begin(), ranks.end(), [](const RankPlacement& p) {
    return !p.device.is_cuda() || !p.gpu_id.empty();
  });
  // (node, the GPU's identity, or its index as "cuda:N") -> the ranks on it.
  std::map<std::pair<std::string, std::string>, std::vector<int>> gpu_users;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    const RankPlacement& p = ranks[static_cast<size_t>(r)];
    nodes.insert(p.node);
    if (p.device.is_cuda()) {
      on_gpu.push_back(r);
      gpu_users[{p.node, by_identity ? p.gpu_id : p.device.str()}].push_back(r);
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
            fmt::format("{} share {}{}, and NCCL needs one GPU per rank: collectives go "
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

std::string format_placement(const PublishedPlacement& entry) {
  const RankPlacement& p = entry.placement;
  const auto or_dash = [](const std::string& s) { return s.empty() ? std::string("-") : s; };
  const std::string build = entry.build.empty() ? "" : entry.build + " ";
  return fmt::format("{}{} {} {} {}", build, or_dash(entry.asked),
                     entry.asked.empty() ? p.device.str() : "-",
                     entry.asked.empty() ? or_dash(p.gpu_id) : "-", p.node);
}

PublishedPlacement parse_placement(const std::string& text) {
  // The build first, where the rank's lockstep publishes one.
  const size_t build_end = text.find(' ');
  const bool has_build = build_end != std::string::npos && is_build(text.substr(0, build_end));
  const std::string line = has_build ? text.substr(build_end + 1) : text;
  const size_t first = line.find(' ');
  const size_t second = first == std::string::npos ? first : line.find(' ', first + 1);
  const size_t third = second == std::string::npos ? second : line.find(' ', second + 1);
  LOCKSTEP_CHECK(third != std::string::npos,
                 "a rank published '{}' where '<build> <backend> <device> <GPU identity> <node "
                 "key>' was expected: do all ranks run the same build of lockstep?",
                 text);
  const auto field = [](std::string s) { return s == "-" ? std::string() : s; };
  PublishedPlacement entry;
  if (has_build) entry.build = text.substr(0, build_end);
  entry.asked = field(line.substr(0, first));
  const std::string device = line.substr(first + 1, second - first - 1);
  entry.placement.device = device == "-" ? runtime::Device::cpu() : runtime::Device::parse(device);
  entry.placement.gpu_id = field(line.substr(second + 1, third - second - 1));
  entry.placement.node = line.substr(third + 1);
  return entry;
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
