// MPI, initialised once per process, and MPI's checking macro.
//
// ensure_mpi_initialized() calls MPI_Init_thread asking for
// MPI_THREAD_MULTIPLE and checks the level granted; MPI is finalised when the
// process exits. If the application initialised MPI itself, that is used.
#pragma once

#include <string>

namespace lockstep::collectives::mpi {

// Initialises MPI if needed; throws lockstep::Error when the thread level
// granted is too low for lockstep's use (a progress thread), saying which
// level was granted and what to do.
void ensure_mpi_initialized();
int world_rank();
int world_size();
// Collective over MPI_COMM_WORLD: every rank returns `root`'s `value`.
std::string broadcast_string(const std::string& value, int root);

}  // namespace lockstep::collectives::mpi

// Throws lockstep::Error with file:line, this rank and MPI's own error string
// when an MPI call does not return MPI_SUCCESS.
#define LOCKSTEP_MPI_CHECK(call) \
  ::lockstep::collectives::mpi::check_mpi_result((call), #call, __FILE__, __LINE__)

namespace lockstep::collectives::mpi {
void check_mpi_result(int code, const char* call, const char* file, int line);
}  // namespace lockstep::collectives::mpi
