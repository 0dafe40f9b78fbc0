// The mpi backend: Open MPI's collectives on MPI_COMM_WORLD (or a duplicate of
// it per group), for processes started by mpirun.
//
// Calls run in issue order on one progress thread per group (mpi_progress.h):
// collectives as MPI's blocking calls, so Open MPI's tuned shared-memory
// algorithms apply; send and recv as non-blocking calls tested until done.
// bf16 and f16 reductions use user-defined MPI_Ops.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/collectives/process_group.h"

namespace lockstep::collectives {

// `rank` and `size` must equal MPI_COMM_WORLD's (an error says otherwise).
// Each group duplicates MPI_COMM_WORLD (MPI_Comm_dup is collective), so every
// rank must create its groups in the same order.
std::shared_ptr<ProcessGroup> make_mpi_group(int rank, int size, const std::string& name,
                                             std::chrono::milliseconds timeout);

// The processes whose MPI_COMM_WORLD ranks are `members` (sorted, the same on
// every process), ranked by their place in it: new_group() over mpi. Splits
// MPI_COMM_WORLD (MPI_Comm_split is collective): every process of the world
// calls it, members or not, in the same order among its groups; the others
// get nullptr.
std::shared_ptr<ProcessGroup> make_mpi_subgroup(const std::vector<int>& members,
                                                const std::string& name,
                                                std::chrono::milliseconds timeout);

}  // namespace lockstep::collectives
