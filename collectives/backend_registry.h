// Backend name -> the function that makes a group of it: one table, with an
// entry for every backend of backends.h that is built in, and "shm+gloo".
// init_process_group() and make_process_group() make every group through it.
// The one place in collectives/ (outside its CUDA folders) that knows which
// of them the build has.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "lockstep/collectives/node_topology.h"
#include "lockstep/collectives/process_group.h"
#include "lockstep/distributed/store/store.h"

namespace lockstep::collectives {

struct GroupArgs {
  std::shared_ptr<distributed::Store> store;
  int rank = 0;
  int size = 1;
  std::string name;
  std::chrono::milliseconds timeout{ProcessGroup::kDefaultTimeout};
  // shm+gloo: the node topology when the caller has it; else it is found
  // through the store with `node_key` (empty: this host's; see node_topology.h).
  const NodeTopology* topology = nullptr;
  std::string node_key;
  // nccl: the communicator's CUDA device; -1: the calling thread's current one.
  int device = -1;
};

// Throws, saying what is built in and how to build `backend` in, unless it is
// a known backend that this build has ("gloo", "mpi", "nccl", "shm",
// "shm+gloo").
void require_backend(std::string_view backend);

// A group of `backend` (require_backend's check first), as the backend itself
// makes it: no CUDA staging or desync checking around it.
std::shared_ptr<ProcessGroup> make_backend_group(std::string_view backend, const GroupArgs& args);

// `group` of `backend`, taking device tensors too where the build has a
// device and the backend does not take them itself (CPU backends' collectives
// on CUDA tensors are staged through host memory; nccl's group is returned
// as it is).
std::shared_ptr<ProcessGroup> with_device_staging(std::shared_ptr<ProcessGroup> group,
                                                  std::string_view backend);

}  // namespace lockstep::collectives
