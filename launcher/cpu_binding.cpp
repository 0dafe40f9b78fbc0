#include "launcher/cpu_binding.h"

#include <sched.h>

#include <fstream>
#include <map>
#include <utility>

#include <fmt/format.h>

namespace lockstep::launcher {
namespace {

// -1 when the kernel does not say (then every CPU counts as its own core).
int topology_id(int cpu, const char* name) {
  std::ifstream in(fmt::format("/sys/devices/system/cpu/cpu{}/topology/{}", cpu, name));
  int id = -1;
  if (!(in >> id)) return -1;
  return id;
}

}  // namespace

std::vector<std::vector<int>> allowed_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return {};
  std::map<std::pair<int, int>, size_t> core_of;  // (package, core) -> index
  std::vector<std::vector<int>> cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    const int package = topology_id(cpu, "physical_package_id");
    const int core = topology_id(cpu, "core_id");
    if (package < 0 || core < 0) {
      cores.push_back({cpu});
      continue;
    }
    const auto [it, added] = core_of.try_emplace({package, core}, cores.size());
    if (added) cores.emplace_back();
    cores[it->second].push_back(cpu);
  }
  return cores;
}

std::vector<std::vector<int>> share_cores(const std::vector<std::vector<int>>& cores,
                                          int local_size) {
  std::vector<std::vector<int>> units = cores;
  if (units.size() < static_cast<size_t>(local_size)) {
    // Fewer cores than ranks: share out hardware threads instead.
    units.clear();
    for (const auto& core : cores) {
      for (int cpu : core) units.push_back({cpu});
    }
    if (units.size() < static_cast<size_t>(local_size)) return {};
  }
  const size_t n = units.size();
  const size_t ranks = static_cast<size_t>(local_size);
  std::vector<std::vector<int>> shares(ranks);
  for (size_t r = 0; r < ranks; ++r) {
    for (size_t u = r * n / ranks; u < (r + 1) * n / ranks; ++u) {
      shares[r].insert(shares[r].end(), units[u].begin(), units[u].end());
    }
  }
  return shares;
}

}  // namespace lockstep::launcher
