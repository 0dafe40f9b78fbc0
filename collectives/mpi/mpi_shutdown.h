// The order of things at process exit: every live mpi group stops its
// progress thread and frees its communicator, then MPI_Finalize runs (only
// when lockstep initialised MPI; see mpi_runtime.cpp).
//
// Groups register a hook when created and remove it when destroyed; the
// at-exit finaliser runs the hooks of the groups still alive. A group whose
// collective can never complete (it timed out: MPI cannot cancel it) calls
// mark_unfinishable(), and the finaliser then skips MPI_Finalize, which would
// wait for that collective's peers; mpirun reports the rank as having exited
// without finalising, which is what happened.
#pragma once

#include <functional>
#include <string>

namespace lockstep::collectives::mpi {

// Returns an id for remove_shutdown_hook. `hook` must not throw.
int add_shutdown_hook(std::function<void()> hook);
// Blocks while the hooks are running, so a group's destructor never races its
// own hook.
void remove_shutdown_hook(int id);
// Runs (once) and drops every registered hook; called by the finaliser.
void run_shutdown_hooks();

// `why` is printed when the finaliser skips MPI_Finalize.
void mark_unfinishable(const std::string& why);
// Empty when MPI_Finalize is safe, else the first reason given.
std::string unfinishable_reason();

}  // namespace lockstep::collectives::mpi
