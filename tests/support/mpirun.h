// Starting test workers under mpirun: finding it, the reason to skip when
// lockstep has no MPI, and the command line that works in a 2-core container.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "support/subprocess.h"

namespace lockstep::testing {

// mpirun from PATH (CMake's MPIEXEC_EXECUTABLE is not passed to the tests);
// empty when there is none.
std::string find_mpirun();

// Empty when mpi tests can run, else why not (for "SKIPPED: <reason>").
std::string mpi_skip_reason();

// mpirun -np `ranks` build/bin/`worker` `args`: oversubscribed (CI has 2
// cores), unbound, shared memory only; Open MPI refuses root without the two
// ALLOW variables.
ProcessResult run_under_mpirun(int ranks, const std::string& worker,
                               const std::vector<std::string>& args,
                               std::chrono::milliseconds limit,
                               const std::vector<std::string>& extra_env = {});

}  // namespace lockstep::testing
