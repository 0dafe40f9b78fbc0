// Which ranks of a group share a node: what the default backend choice and
// the hierarchical all-reduce (hierarchical_group.h) are built on.
//
// A node is a set of ranks that can share memory. Each rank names its node
// with a key (this_node_key()); discover_topology() exchanges the keys through
// the store, so every rank of a group ends with the same NodeTopology.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "lockstep/distributed/launch_env.h"
#include "lockstep/distributed/store/store.h"

namespace lockstep::collectives {

// LOCKSTEP_NODE_ID (RankInfo::node_id) when set, else "<hostname>:<boot id>"
// (/proc/sys/kernel/random/boot_id; the host name alone where that cannot be
// read). The boot id tells apart machines that share a host name.
std::string this_node_key(const distributed::RankInfo& info);

// This host's name (gethostname), or "unknown-host".
std::string host_name();

struct NodeTopology {
  // Nodes are numbered 0, 1, ... in order of their lowest rank.
  std::vector<int> node_of_rank;  // rank -> node
  int nodes = 1;
  std::vector<int> leaders;       // node -> its lowest rank
  // This rank's node, its index among that node's ranks, how many there are,
  // and which (ascending; local_ranks[0] is the node's leader).
  int node = 0;
  int local_rank = 0;
  int local_size = 1;
  std::vector<int> local_ranks;

  bool single_node() const { return nodes == 1; }
};

// Builds the topology of `rank` in a group of `size` from every rank's node
// key (each rank's `node_key`; compared as exact strings). Every rank of the
// group must call it with the same `group_name`; a group made again under the
// same name on the same store reads fresh keys. Throws (naming the ranks that
// did not publish) when the keys do not all arrive within `timeout`.
NodeTopology discover_topology(distributed::Store& store, int rank, int size,
                               const std::string& group_name, const std::string& node_key,
                               std::chrono::milliseconds timeout);

// Every rank's `value` (rank 0's first) through the store: each rank of the
// group calls it with the same `group_name` and `topic`, and a later call
// reads fresh values. Throws, naming the ranks whose `what` did not arrive
// within `timeout`, and at once when a rank was given another `size` than
// rank 0. With `watch_exits` (ranks are the job's ranks), also within about a
// second of a rank whose end its launcher recorded (distributed/exited_ranks.h).
std::vector<std::string> exchange_through_store(distributed::Store& store, int rank, int size,
                                                const std::string& group_name,
                                                const std::string& topic,
                                                const std::string& value, const std::string& what,
                                                std::chrono::milliseconds timeout,
                                                bool watch_exits = false);

// The topology from a known node key per rank (what discover_topology() ends
// with); tests build explicit topologies with it.
NodeTopology topology_from_keys(const std::vector<std::string>& keys, int rank);

}  // namespace lockstep::collectives
