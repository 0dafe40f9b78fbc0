// The mpi backend: Open MPI's collectives on MPI_COMM_WORLD (or a duplicate of
// it per group), for processes started by mpirun.
//
// Each collective is issued as a non-blocking MPI call (MPI_Iallreduce, ...)
// in issue order by one progress thread per group, which drives MPI_Test
// until completion; bf16 and f16 reductions use user-defined MPI_Ops.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "lockstep/collectives/process_group.h"

namespace lockstep::collectives {

// `rank` and `size` must equal MPI_COMM_WORLD's (an error says otherwise).
// Each group duplicates MPI_COMM_WORLD (MPI_Comm_dup is collective), so every
// rank must create its groups in the same order.
std::shared_ptr<ProcessGroup> make_mpi_group(int rank, int size, const std::string& name,
                                             std::chrono::milliseconds timeout);

}  // namespace lockstep::collectives
