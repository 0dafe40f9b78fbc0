#include "lockstep/collectives/mpi/mpi_runtime.h"

#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "lockstep/collectives/mpi/mpi_shutdown.h"
#include "lockstep/runtime/error.h"

namespace lockstep::collectives::mpi {
namespace {

std::mutex init_mutex;
bool initialized_here = false;  // lockstep called MPI_Init_thread, so it finalises

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown thread level";
  }
}

bool mpi_active() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized != 0 && finalized == 0;
}

// Registered with atexit right after MPI_Init_thread, so it runs before MPI's
// own exit handlers and after the destructors of statics created later.
void finalize_at_exit() {
  run_shutdown_hooks();  // every group's progress thread is joined here
  if (!mpi_active()) return;  // the application finalised MPI itself
  const std::string why = unfinishable_reason();
  if (!why.empty()) {
    std::fprintf(stderr,
                 "lockstep: not calling MPI_Finalize on rank %d: %s; MPI_Finalize would wait "
                 "for it\n",
                 world_rank(), why.c_str());
    return;
  }
  const int rc = MPI_Finalize();
  if (rc != MPI_SUCCESS) std::fprintf(stderr, "lockstep: MPI_Finalize failed (code %d)\n", rc);
}

}  // namespace

// Level: lockstep's progress threads call MPI concurrently with each other and
// with the application's thread (one per group), so anything below
// MPI_THREAD_MULTIPLE is refused rather than serialised behind a lock that the
// application's own MPI calls would not take.
void ensure_mpi_initialized() {
  std::lock_guard lock(init_mutex);
  int initialized = 0, finalized = 0;
  LOCKSTEP_MPI_CHECK(MPI_Initialized(&initialized));
  LOCKSTEP_MPI_CHECK(MPI_Finalized(&finalized));
  LOCKSTEP_CHECK(finalized == 0,
                 "MPI has already been finalised in this process; the mpi backend cannot be "
                 "used after MPI_Finalize (create lockstep's process groups before finalising)");
  int provided = MPI_THREAD_SINGLE;
  if (initialized == 0) {
    LOCKSTEP_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    initialized_here = true;
    // Errors on lockstep's own MPI_COMM_WORLD calls come back as codes for
    // LOCKSTEP_MPI_CHECK; an application's MPI init keeps its own handler.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    std::atexit(finalize_at_exit);
  } else {
    LOCKSTEP_MPI_CHECK(MPI_Query_thread(&provided));
  }
  if (provided == MPI_THREAD_MULTIPLE) return;
  if (initialized_here) {
    throw Error(fmt::format(
        "this MPI library granted {} when asked for MPI_THREAD_MULTIPLE, which lockstep's mpi "
        "backend needs (a progress thread per group calls MPI); use an MPI built with thread "
        "support (Debian's Open MPI has it: ompi_info | grep THREAD_MULTIPLE) or the gloo "
        "backend",
        thread_level_name(provided)));
  }
  throw Error(fmt::format(
      "the application initialised MPI with {}, but lockstep's mpi backend needs "
      "MPI_THREAD_MULTIPLE (a progress thread per group calls MPI); initialise MPI with "
      "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) or let lockstep initialise it",
      thread_level_name(provided)));
}

int world_rank() {
  ensure_mpi_initialized();
  int rank = 0;
  LOCKSTEP_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  return rank;
}

int world_size() {
  ensure_mpi_initialized();
  int size = 0;
  LOCKSTEP_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  return size;
}

std::string broadcast_string(const std::string& value, int root) {
  const int size = world_size();
  LOCKSTEP_CHECK(root >= 0 && root < size,
                 "broadcast_string: root {} is not a rank of MPI_COMM_WORLD ({} ranks)", root,
                 size);
  // Length first, so the receivers can size their buffer.
  uint64_t length = value.size();
  LOCKSTEP_MPI_CHECK(MPI_Bcast(&length, 1, MPI_UINT64_T, root, MPI_COMM_WORLD));
  LOCKSTEP_CHECK(length <= static_cast<uint64_t>(INT32_MAX),
                 "broadcast_string: {} bytes is more than one MPI_Bcast can carry", length);
  std::string out = world_rank() == root ? value : std::string(length, '\0');
  if (length > 0) {
    LOCKSTEP_MPI_CHECK(
        MPI_Bcast(out.data(), static_cast<int>(length), MPI_CHAR, root, MPI_COMM_WORLD));
  }
  return out;
}

void check_mpi_result(int code, const char* call, const char* file, int line) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    std::snprintf(text, sizeof text, "unknown MPI error code %d", code);
  }
  std::string rank = "?";
  if (mpi_active()) {
    int r = 0;
    if (MPI_Comm_rank(MPI_COMM_WORLD, &r) == MPI_SUCCESS) rank = std::to_string(r);
  }
  const char* base = std::strrchr(file, '/');
  throw Error(fmt::format("MPI error on rank {} at {}:{}: {} returned {} ({}); if a peer "
                          "process died, its own output and mpirun's report say why",
                          rank, base != nullptr ? base + 1 : file, line, call, code, text));
}

}  // namespace lockstep::collectives::mpi
