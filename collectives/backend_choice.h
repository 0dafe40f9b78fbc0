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
//
// Ranks share a GPU where they name the same physical one on one node: each
// publishes its GPU's identity (DeviceBackend::physical_id), as a launcher
// that gives every rank its own CUDA_VISIBLE_DEVICES (Slurm's
// --gpus-per-task, torchrun with one GPU per worker) shows each its GPU as
// cuda:0. Where some rank has no identity, the index on the node decides.
#pragma once

#include <string>
#include <vector>

#include "lockstep/runtime/dtype.h"

namespace lockstep::collectives {

struct RankPlacement {
  std::string node;        // the rank's node key (node_topology.h)
  runtime::Device device;  // what the rank computes on
  std::string gpu_id;      // the device's physical identity; "" where unknown
};

struct BackendChoice {
  std::string backend;
  std::string note;  // why the choice is not the obvious one; else empty
};

// `ranks[r]` is rank r's placement. Throws lockstep::Error where some ranks
// compute on GPUs and others on the CPU.
BackendChoice choose_default_backend(const std::vector<RankPlacement>& ranks, bool nccl_built);

// One rank's entry in init_process_group()'s exchange: the backend it asked
// for ("" for the default) and where it runs. A rank that asked for a backend
// publishes only its node (its device is not looked at, and reads as the CPU).
// `build` is the rank's build of lockstep (build_identity.h's this_build()).
struct PublishedPlacement {
  std::string asked;
  RankPlacement placement;
  std::string build;
};

// The entry as one line, "<build> <backend> <device> <GPU identity> <node
// key>" with "-" for what is empty or not looked at (only the node key may
// hold a space), and back. Without a build (what lockstep published before
// wire protocol 1) the line starts at the backend, and parses with `build`
// empty, for the error that names it. Parsing throws lockstep::Error for a
// malformed entry. The line's layout is part of the wire protocol
// (distributed/wire_protocol.h): change the number with it.
std::string format_placement(const PublishedPlacement& entry);
PublishedPlacement parse_placement(const std::string& line);

// The backend that every rank of group `group` asked for: `asked[r]` is rank
// r's (LOCKSTEP_BACKEND or InitOptions::backend; "" for the default). Throws
// lockstep::Error naming which ranks asked for which where they differ: each
// rank would wait for the others in its own backend's rendezvous.
std::string agreed_backend(const std::vector<std::string>& asked, const std::string& group);

}  // namespace lockstep::collectives
