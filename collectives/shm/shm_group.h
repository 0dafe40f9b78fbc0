// The shm backend: collectives among the ranks of one node through a shared
// memory segment (see shm_algorithms.h for how each collective moves data).
//
// Rank 0 creates the segment and shares its name through the store; once every
// rank has mapped it, the name is unlinked, so no /dev/shm file outlives the
// group even if ranks are killed. Collectives run in issue order on one
// background thread per group; a rank that waits on a Work whose collective
// has not started yet runs it itself, saving two thread hand-offs on small
// messages. send/recv go through a gloo group made alongside (gloo built in).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "lockstep/collectives/process_group.h"
#include "lockstep/distributed/store/store.h"

namespace lockstep::collectives {

struct ShmOptions {
  // Bytes of each of a rank's two staging buffers (at least 4 KiB); 0: 1 MiB.
  // Rank 0's choice is the one every rank uses.
  size_t buffer_bytes = 0;
  // How long a waiting rank spins before it sleeps on a futex; negative: the
  // default (shm::Comm::kDefaultSpin).
  std::chrono::microseconds spin{-1};
  // Make the gloo group that send and recv go through (when gloo is built in).
  bool p2p = true;
};

// Every rank must run on the same node (share /dev/shm); a rank that cannot
// open rank 0's segment fails saying so.
std::shared_ptr<ProcessGroup> make_shm_group(std::shared_ptr<distributed::Store> store, int rank,
                                             int size, const std::string& name,
                                             std::chrono::milliseconds timeout,
                                             const ShmOptions& options = {});

}  // namespace lockstep::collectives
