// --bind-to core: each rank of a node runs on its own share of the node's
// cores, so ranks (and their communication threads) do not migrate onto each
// other's cores and lose their caches. Open MPI binds by default for the same
// reason; lockstep-run binds only when asked.
#pragma once

#include <vector>

namespace lockstep::launcher {

// The logical CPUs this process may run on, grouped by physical core (SMT
// siblings together), cores in the order of their first CPU.
std::vector<std::vector<int>> allowed_cores();

// Rank `local` of `local_size` gets cores [local*n/L, (local+1)*n/L) of the n
// cores: whole cores, as even as they divide. With fewer cores than ranks the
// CPUs themselves are shared out; with fewer CPUs than ranks, nobody is bound
// (empty result).
std::vector<std::vector<int>> share_cores(const std::vector<std::vector<int>>& cores,
                                          int local_size);

}  // namespace lockstep::launcher
