// The default backend, from where the ranks run and what they compute on:
//
//   every rank on the CPU, one node         shm
//   every rank on the CPU, several nodes    shm+gloo (hierarchical_group.h)
//   every rank on a GPU of its own          nccl
//   every rank on a GPU, some sharing one   shm or shm+gloo as above, with CUDA
//                                           tensors staged through host memory
//                                           (NCCL refuses two ranks on one GPU)
//   some ranks on GPUs, others on the CPU   an error naming them
//
// A build without NCCL takes the staged CPU backends for GPUs too. The
// choices that are not the obvious one come with a note for rank 0 to print.
// init_process_group() applies it once every rank has published its node and
// device, so all ranks choose the same. Pure: tests drive it with any layout.
#pragma once

#include <string>
#include <vector>

#include "lockstep/runtime/dtype.h"

namespace lockstep::collectives {

struct RankPlacement {
  std::string node;        // the rank's node key (node_topology.h)
  runtime::Device device;  // what the rank computes on
};

struct BackendChoice {
  std::string backend;
  std::string note;  // why the choice is not the obvious one; else empty
};

// `ranks[r]` is rank r's placement. Throws lockstep::Error where some ranks
// compute on GPUs and others on the CPU.
BackendChoice choose_default_backend(const std::vector<RankPlacement>& ranks, bool nccl_built);

// The backend that every rank of group `group` asked for: `asked[r]` is rank
// r's (LOCKSTEP_BACKEND or InitOptions::backend; "" for the default). Throws
// lockstep::Error naming which ranks asked for which where they differ: each
// rank would wait for the others in its own backend's rendezvous.
std::string agreed_backend(const std::vector<std::string>& asked, const std::string& group);

}  // namespace lockstep::collectives
