#include "lockstep/collectives/node_topology.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lockstep/collectives/process_group.h"
#include "lockstep/distributed/exited_ranks.h"
#include "lockstep/runtime/error.h"

namespace lockstep::collectives {
std::string host_name() {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown-host";
  return name;
}

namespace {

// How often a wait for other ranks' values reads which ranks have exited: one
// store round trip.
constexpr std::chrono::milliseconds kExitCheckEvery{1000};

// The kernel's id of this boot: the same for every process (and container)
// of one running kernel, different across machines and reboots.
std::string boot_id() {
  std::ifstream file("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(file, id);
  return id;
}

std::string key_of(const std::string& prefix, int rank) { return fmt::format("{}/{}", prefix, rank); }

// Rank r's published "<size> <value>": its value, once its size is this
// rank's. Rank 0's size is this rank's once checked, so a difference names
// rank 0's size and the other's.
std::string value_if_same_size(const std::string& published, int r, int rank, int size,
                               const std::string& group_name) {
  const size_t space = published.find(' ');
  int theirs = 0;
  const char* first = published.data();
  const auto [end, ec] = std::from_chars(first, first + std::min(space, published.size()), theirs);
  LOCKSTEP_CHECK(space != std::string::npos && ec == std::errc() && end == first + space,
                 "group '{}': rank {} published '{}' where '<size> <value>' was expected: do all "
                 "ranks run the same build of lockstep?",
                 group_name, r, published);
  if (theirs != size) {
    throw Error(fmt::format(
        "the ranks of group '{}' disagree on its size: rank 0 has {} ranks, rank {} has {}; give "
        "every rank the same world size (WORLD_SIZE, or the launcher's count of ranks)",
        group_name, r == 0 ? theirs : size, r == 0 ? rank : r, r == 0 ? size : theirs));
  }
  return published.substr(space + 1);
}

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

// Every rank publishes its size and value under
// "<group>/<topic>/<instance>/<rank>", where <instance> counts this rank's
// exchanges of the topic for the group name: all ranks of one making of a
// group agree on it, and a later making does not see the values of an earlier
// one. Ranks told different sizes (WORLD_SIZE set differently on one) would
// each wait out the timeout for ranks only they have: every rank reads rank
// 0's value first, and compares sizes before waiting for the others.
std::vector<std::string> exchange_through_store(distributed::Store& store, int rank, int size,
                                                const std::string& group_name,
                                                const std::string& topic,
                                                const std::string& value, const std::string& what,
                                                std::chrono::milliseconds timeout,
                                                bool watch_exits) {
  LOCKSTEP_CHECK(rank >= 0 && rank < size, "{} of group '{}': rank {} is not in a group of {} ranks",
                 topic, group_name, rank, size);
  const auto deadline =
      std::chrono::steady_clock::now() + std::min(timeout, ProcessGroup::kLongestTimeout);
  const auto exists = [&](const std::string& key) {
    try {
      store.wait({key}, std::chrono::milliseconds(1));
      return true;
    } catch (const distributed::StoreTimeout&) {
      return false;
    }
  };
  // An exchange a rank gave up on (it timed out, and throws) is marked
  // abandoned under its "state" key; the ranks that found every value mark it
  // "met" instead, and whichever comes first holds. A rank that comes late to
  // an abandoned exchange goes on to the next instance, where the rank that
  // gave up (and tries again) is: it used to take that rank's stale value as
  // a meeting and go on into the backend's rendezvous alone, one instance
  // behind the others in every attempt after.
  int64_t instance = 0;
  std::string prefix, state;
  do {
    instance = store.add(fmt::format("{}/{}/instances/{}", group_name, topic, rank), 1);
    prefix = fmt::format("{}/{}/{}", group_name, topic, instance);
    state = prefix + "/state";
  } while (exists(state) && store.get_string(state) == "abandoned" &&
           std::chrono::steady_clock::now() < deadline);
  store.set(key_of(prefix, rank), fmt::format("{} {}", size, value));

  std::vector<std::string> all;
  for (int r = 0; r < size; ++r) all.push_back(key_of(prefix, r));
  const auto published = [&](int r) { return exists(all[static_cast<size_t>(r)]); };
  // Until `keys` exist; each second, a rank that ended without publishing
  // (what its launcher recorded) ends the wait naming it.
  const auto wait_for = [&](const std::vector<std::string>& keys) {
    for (;;) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      const auto slice = std::max(
          std::chrono::milliseconds(1), watch_exits ? std::min(left, kExitCheckEvery) : left);
      try {
        store.wait(keys, slice);
        return;
      } catch (const distributed::StoreTimeout&) {
        if (!watch_exits || slice >= left) throw;
      }
      for (const auto& e : distributed::exited_ranks(store)) {
        if (e.rank < 0 || e.rank >= size || e.rank == rank || published(e.rank)) continue;
        throw Error(fmt::format(
            "rank {} of group '{}' ({} ranks) waited for every rank's {}, but rank {} {} "
            "without joining the group; every rank must join it (does rank {} return or exit "
            "before init_process_group?)",
            rank, group_name, size, what, e.rank, e.how, e.rank));
      }
    }
  };
  const auto read_values = [&] {
    std::vector<std::string> values;
    for (int r = 0; r < size; ++r) {
      values.push_back(value_if_same_size(store.get_string(all[static_cast<size_t>(r)]), r, rank,
                                          size, group_name));
    }
    return values;
  };
  // "met" or "abandoned", as the state key holds it after this rank's say.
  const auto settle = [&](const char* mine) {
    return distributed::to_string(
        store.compare_set(state, {}, distributed::to_bytes(std::string_view(mine))));
  };
  try {
    wait_for({all[0]});
    value_if_same_size(store.get_string(all[0]), 0, rank, size, group_name);
    wait_for(all);
    if (settle("met") == "abandoned") {
      if (std::chrono::steady_clock::now() < deadline) {
        return exchange_through_store(store, rank, size, group_name, topic, value, what,
                                      std::chrono::ceil<std::chrono::milliseconds>(
                                          deadline - std::chrono::steady_clock::now()),
                                      watch_exits);
      }
      throw distributed::StoreTimeout("abandoned");
    }
  } catch (const distributed::StoreTimeout&) {
    if (settle("abandoned") == "met") return read_values();
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      if (!published(r)) missing.push_back(r);
    }
    throw Error(fmt::format(
        "rank {} of group '{}' ({} ranks) waited {} ms for every rank's {}, but rank "
        "{} did not publish one; check that every rank started and uses the same store",
        rank, group_name, size, timeout.count(), what, fmt::join(missing, ", rank ")));
  }
  return read_values();
}

NodeTopology discover_topology(distributed::Store& store, int rank, int size,
                               const std::string& group_name, const std::string& node_key,
                               std::chrono::milliseconds timeout) {
  return topology_from_keys(exchange_through_store(store, rank, size, group_name, "topology",
                                                   node_key, "node identity", timeout),
                            rank);
}

}  // namespace lockstep::collectives
