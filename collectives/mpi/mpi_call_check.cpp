#include "lockstep/collectives/mpi/mpi_call_check.h"

#include <vector>

#include "lockstep/collectives/mpi/mpi_runtime.h"
#include "lockstep/collectives/work.h"

namespace lockstep::collectives::mpi {
void check_same_call(MPI_Comm comm, const Call& call) {
  const uint64_t h = call_hash(call.signature);
  uint64_t maxima[2] = {h, ~h};
  LOCKSTEP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, maxima, 2, MPI_UINT64_T, MPI_MAX, comm));
  if (maxima[0] == h && maxima[1] == ~h) return;
  int size = 0;
  LOCKSTEP_MPI_CHECK(MPI_Comm_size(comm, &size));
  const PackedSignature mine = pack(call.signature);
  std::vector<PackedSignature> all(static_cast<size_t>(size));
  LOCKSTEP_MPI_CHECK(
      MPI_Allgather(mine.data(), 4, MPI_UINT64_T, all.data(), 4, MPI_UINT64_T, comm));
  std::vector<CallSignature> every_rank;
  for (const auto& words : all) every_rank.push_back(unpack(words));
  throw CollectiveMismatch(mismatch_message(call, every_rank));
}

}  // namespace lockstep::collectives::mpi
