// The mpi backend's call check: before each collective, on the group's
// progress thread, one MPI_Allreduce of two words, a hash of the call's
// signature and its complement, with MPI_MAX. Every rank called the same
// collective exactly when both maxima are its own values, so every rank
// learns a difference from the same call; only then do the ranks gather
// their signatures (MPI_Allgather) to name what each called, and throw
// CollectiveMismatch. A check costs one 16-byte all-reduce (microseconds on
// one node), far less than gathering the signatures every time.
#pragma once

#include <mpi.h>

#include "lockstep/collectives/call.h"

namespace lockstep::collectives::mpi {

// Collective over `comm`: every rank calls it before the collective `call`.
void check_same_call(MPI_Comm comm, const Call& call);

}  // namespace lockstep::collectives::mpi
