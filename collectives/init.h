// init_process_group(): from the environment (distributed/launch_env.h) to a ready
// ProcessGroup.
//
// Backend choice: the one asked for (InitOptions::backend or
// LOCKSTEP_BACKEND: "nccl", "gloo", "mpi", "shm" or "shm+gloo"), else one
// picked from where the ranks run and what they compute on. Every rank
// publishes its node (host name and boot id, or LOCKSTEP_NODE_ID; see
// node_topology.h) and its device (InitOptions::device) through the store,
// then backend_choice.h decides, the same on every rank:
//   CPU ranks on one node    "shm": collectives through shared memory, far
//                            faster than any socket on one host;
//   on several nodes         "shm+gloo": all-reduce within each node over shm
//                            and across nodes over gloo among one leader per
//                            node; other collectives over gloo
//                            (hierarchical_group.h). Needs gloo built in.
//   a GPU per rank           "nccl" (nccl/nccl_group.h); its communicator is
//                            on the rank's device (InitOptions::device),
//                            else on the calling thread's current CUDA
//                            device, which distributed::select_device() sets.
//   ranks sharing a GPU      "shm" or "shm+gloo", CUDA tensors staged through
//                            host memory (cuda_staging/staging_group.h); rank
//                            0 prints a note saying so.
// A backend that is not built in gives an error listing those that are and
// how to build the missing one in.
//
// Store: lockstep-run serves it and passes LOCKSTEP_STORE_ADDR; where the
// environment says rank 0 serves it (RankInfo::rank0_serves_store: torchrun,
// MASTER_ADDR/MASTER_PORT, Slurm's derived address; distributed/launch_env.h), rank 0
// serves it there (one server for all its groups at that address), listening
// on the address's own interface where it is one of this host's
// (distributed/store/listen_address.h); under mpirun with no
// address given and MPI built in, rank 0 serves it on a free port and shares
// the address (and a fresh token) through MPI.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "lockstep/collectives/process_group.h"
#include "lockstep/runtime/dtype.h"
#include "lockstep/distributed/launch_env.h"
#include "lockstep/distributed/store/store.h"

namespace lockstep::collectives {

struct InitOptions {
  // "nccl", "gloo", "mpi", "shm", "shm+gloo"; empty: LOCKSTEP_BACKEND, else the default.
  std::string backend;
  std::optional<std::chrono::milliseconds> timeout;  // default: LOCKSTEP_TIMEOUT_S, else 10 min
  std::string name = "default";
  // What this rank computes on, for the default backend and nccl's
  // communicator: default distributed::selected_device(), else the CPU.
  std::optional<runtime::Device> device;
  std::optional<distributed::RankInfo> rank_info;  // default: read_rank_info()
  std::shared_ptr<distributed::Store> store;       // default: connect as described above
};

// A child forked from this process does not destroy the groups it
// inherited (their threads are not in it); they end with it. So for
// make_process_group().
std::shared_ptr<ProcessGroup> init_process_group(InitOptions options = {});

// Builds a group of `backend` from an explicit store, rank and size (all
// ranks pass the same `name`). What init_process_group() ends with; tests use
// it directly with a MemoryStore and one thread per rank. For "shm+gloo" it
// finds which ranks share a node through the store, `node_key` naming this
// rank's (empty: LOCKSTEP_NODE_ID where set, else this host's; see
// this_node_key()).
std::shared_ptr<ProcessGroup> make_process_group(const std::string& backend,
                                                 std::shared_ptr<distributed::Store> store,
                                                 int rank, int size, const std::string& name,
                                                 std::chrono::milliseconds timeout,
                                                 distributed::DebugLevel debug =
                                                     distributed::DebugLevel::Off,
                                                 const std::string& node_key = {});

}  // namespace lockstep::collectives
