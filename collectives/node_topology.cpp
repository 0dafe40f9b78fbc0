#include "lockstep/collectives/node_topology.h"

#include <unistd.h>

#include <climits>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lockstep/runtime/error.h"

namespace lockstep::collectives {
std::string host_name() {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown-host";
  return name;
}

namespace {

// The kernel's id of this boot: the same for every process (and container)
// of one running kernel, different across machines and reboots.
std::string boot_id() {
  std::ifstream file("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(file, id);
  return id;
}

std::string key_of(const std::string& prefix, int rank) { return fmt::format("{}/{}", prefix, rank); }

}  // namespace

std::string this_node_key(const distributed::RankInfo& info) {
  if (!info.node_id.empty()) return info.node_id;
  const std::string id = boot_id();
  return id.empty() ? host_name() : host_name() + ":" + id;
}

NodeTopology topology_from_keys(const std::vector<std::string>& keys, int rank) {
  const int size = static_cast<int>(keys.size());
  LOCKSTEP_CHECK(rank >= 0 && rank < size, "node topology: rank {} is not in a group of {} ranks",
                 rank, size);
  NodeTopology t;
  t.nodes = 0;
  std::map<std::string, int> node_of_key;
  for (int r = 0; r < size; ++r) {
    const auto [it, fresh] = node_of_key.emplace(keys[static_cast<size_t>(r)], t.nodes);
    if (fresh) {
      ++t.nodes;
      t.leaders.push_back(r);
    }
    t.node_of_rank.push_back(it->second);
  }
  t.node = t.node_of_rank[static_cast<size_t>(rank)];
  for (int r = 0; r < size; ++r) {
    if (t.node_of_rank[static_cast<size_t>(r)] != t.node) continue;
    if (r == rank) t.local_rank = static_cast<int>(t.local_ranks.size());
    t.local_ranks.push_back(r);
  }
  t.local_size = static_cast<int>(t.local_ranks.size());
  return t;
}

// Every rank publishes its value under "<group>/<topic>/<instance>/<rank>",
// where <instance> counts this rank's exchanges of the topic for the group
// name: all ranks of one making of a group agree on it, and a later making
// does not see the values of an earlier one.
std::vector<std::string> exchange_through_store(distributed::Store& store, int rank, int size,
                                                const std::string& group_name,
                                                const std::string& topic,
                                                const std::string& value, const std::string& what,
                                                std::chrono::milliseconds timeout) {
  LOCKSTEP_CHECK(rank >= 0 && rank < size, "{} of group '{}': rank {} is not in a group of {} ranks",
                 topic, group_name, rank, size);
  const int64_t instance =
      store.add(fmt::format("{}/{}/instances/{}", group_name, topic, rank), 1);
  const std::string prefix = fmt::format("{}/{}/{}", group_name, topic, instance);
  store.set(key_of(prefix, rank), value);

  std::vector<std::string> all;
  for (int r = 0; r < size; ++r) all.push_back(key_of(prefix, r));
  try {
    store.wait(all, timeout);
  } catch (const distributed::StoreTimeout&) {
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      try {
        store.wait({all[static_cast<size_t>(r)]}, std::chrono::milliseconds(1));
      } catch (const distributed::StoreTimeout&) {
        missing.push_back(r);
      }
    }
    throw Error(fmt::format(
        "rank {} of group '{}' ({} ranks) waited {} ms for every rank's {}, but rank "
        "{} did not publish one; check that every rank started and uses the same store",
        rank, group_name, size, timeout.count(), what, fmt::join(missing, ", rank ")));
  }
  std::vector<std::string> values;
  for (const auto& k : all) values.push_back(store.get_string(k));
  return values;
}

NodeTopology discover_topology(distributed::Store& store, int rank, int size,
                               const std::string& group_name, const std::string& node_key,
                               std::chrono::milliseconds timeout) {
  return topology_from_keys(exchange_through_store(store, rank, size, group_name, "topology",
                                                   node_key, "node identity", timeout),
                            rank);
}

}  // namespace lockstep::collectives
