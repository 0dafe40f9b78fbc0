#include "launcher/child_env.h"

#include <map>

#include <fmt/format.h>

namespace lockstep::launcher {

RankSlot rank_slot(const Options& options, int local_rank) {
  return {options.node_rank * options.nproc_per_node + local_rank, local_rank};
}

std::vector<std::string> child_environment(const std::vector<std::string>& base,
                                           const Options& options, const RankSlot& slot,
                                           const StoreAddress& store) {
  std::map<std::string, std::string> vars;
  for (const auto& entry : base) {
    const auto eq = entry.find('=');
    if (eq != std::string::npos) vars[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [name, value] : options.exports) vars[name] = value;
  // Ranks, not BLAS threads, use the cores (DESIGN.md, performance habits).
  vars.try_emplace("OMP_NUM_THREADS", "1");

  const bool ipv6 = store.host.find(':') != std::string::npos;
  const std::string addr = ipv6 ? fmt::format("[{}]:{}", store.host, store.port)
                                : fmt::format("{}:{}", store.host, store.port);
  const auto set = [&](const char* name, const auto& value) { vars[name] = fmt::format("{}", value); };
  set("LOCKSTEP_RANK", slot.rank);
  set("LOCKSTEP_WORLD_SIZE", options.world_size());
  set("LOCKSTEP_LOCAL_RANK", slot.local_rank);
  set("LOCKSTEP_LOCAL_WORLD_SIZE", options.nproc_per_node);
  set("LOCKSTEP_NODE_RANK", options.node_rank);
  set("LOCKSTEP_NUM_NODES", options.nnodes);
  set("LOCKSTEP_STORE_ADDR", addr);
  set("LOCKSTEP_TOKEN", store.token);
  // torchrun's names, for programs that read those.
  set("RANK", slot.rank);
  set("WORLD_SIZE", options.world_size());
  set("LOCAL_RANK", slot.local_rank);
  set("LOCAL_WORLD_SIZE", options.nproc_per_node);
  set("MASTER_ADDR", store.host);
  set("MASTER_PORT", store.port);

  std::vector<std::string> out;
  out.reserve(vars.size());
  for (const auto& [name, value] : vars) out.push_back(name + "=" + value);
  return out;
}

}  // namespace lockstep::launcher
