// The hierarchical backend "shm+gloo", for groups that span several nodes:
// all-reduce within each node over shared memory, across nodes over gloo
// among one leader per node, then back within each node.
//
// A group is built from three others, all made here:
//   local    the ranks of this node, over the intra-node backend ("shm");
//   leaders  the lowest rank of every node, over gloo (on leaders only);
//   all      every rank, over gloo.
// allreduce, broadcast, reduce and barrier go local -> leaders -> local
// (hierarchical_group.cpp explains why); allgather and reduce_scatter are
// checked local -> leaders, then go through `all`, and so do send/recv.
// Collectives run in issue order on one background thread of the group, so
// the Work returned is asynchronous as with the other backends; send and recv
// are posted to `all` at once (queued behind collectives they could deadlock).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "lockstep/collectives/node_topology.h"
#include "lockstep/collectives/process_group.h"
#include "lockstep/distributed/store/store.h"

namespace lockstep::collectives {

// Every rank of the group calls it with the same `name` and a `topology` from
// discover_topology() (or, in tests, topology_from_keys()). Needs gloo built
// in. backend() is "<intra_backend>+gloo": "shm+gloo" by default; tests pass
// "gloo" as the intra-node backend to run every rank in one process.
std::shared_ptr<ProcessGroup> make_hierarchical_group(std::shared_ptr<distributed::Store> store,
                                                      int rank, int size,
                                                      const std::string& name,
                                                      std::chrono::milliseconds timeout,
                                                      const NodeTopology& topology,
                                                      const std::string& intra_backend = "shm");

}  // namespace lockstep::collectives
