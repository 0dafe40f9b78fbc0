// new_group(): a group over some of the ranks of another, PyTorch's
// torch.distributed.new_group(ranks).
//
// Every rank of `parent` calls it, with the same `ranks`, in the same order
// among its new_group() calls (as PyTorch requires; non-members too). The
// ranks first agree through the parent's store: a rank list that differs
// across ranks, or holds a duplicate or a rank outside the parent, or is
// empty, fails on every rank alike, naming what each rank passed, rather
// than leaving some ranks waiting on others. Members then get the new group,
// non-members nullptr (PyTorch's NON_GROUP_MEMBER).
//
// The new group's rank() is the caller's index in the sorted `ranks`, its
// size ranks.size(); its calls (roots, peers) take those ranks, as c10d's
// ProcessGroup object and PyTorch's group_src/group_dst do. Its errors name
// the parent's ranks ("rank 3 of group 'default/new_group1' (gloo, 2 ranks:
// ranks 1 and 3 of group 'default')"). It runs over the parent's backend (or
// NewGroupOptions::backend) on the parent's store under its own prefix, and
// is independent of the parent: DDP or ZeRO over it reduce among its ranks
// only, and its collectives need not be ordered with the parent's. The keys
// a call writes in the store are deleted by the next two calls over the same
// parent (made by init_process_group() or make_process_group()), once every
// rank is past reading them, so new_group() in a loop does not grow the store.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/collectives/process_group.h"
#include "lockstep/distributed/launch_env.h"
#include "lockstep/distributed/store/store.h"

namespace lockstep::collectives {

struct NewGroupOptions {
  std::string backend;  // empty: the parent's
  std::optional<std::chrono::milliseconds> timeout;  // default: the parent's
  // Empty: "<parent's name>/new_group<k>" for the parent's k-th new_group().
  std::string name;
  // The store the parent's ranks meet on. Empty: the one the parent was made
  // over by init_process_group() or make_process_group(); needed for any
  // other parent.
  std::shared_ptr<distributed::Store> store;
};

std::shared_ptr<ProcessGroup> new_group(ProcessGroup& parent, std::vector<int> ranks,
                                        const NewGroupOptions& options = {});

// Records that `group`'s ranks meet on `store`, and its debug level (which
// its subgroups take: LOCKSTEP_DEBUG=detail checks theirs too), for
// new_group(); while `group` lives. init_process_group() and
// make_process_group() call it.
void remember_group_store(const std::shared_ptr<ProcessGroup>& group,
                          std::shared_ptr<distributed::Store> store,
                          distributed::DebugLevel debug = distributed::DebugLevel::Off);

}  // namespace lockstep::collectives
