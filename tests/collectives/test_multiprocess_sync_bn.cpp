// SyncBatchNorm across real processes: lockstep-run (gloo) or mpirun (mpi)
// starts tests/workers/sync_bn_worker, which compares SyncBatchNorm with
// BatchNorm on the global batch itself (uneven local batches, an empty rank
// from 3 ranks on) and prints one OK line per rank. The mpi cases are skipped
// (printing "SKIPPED: ...") when lockstep is built without MPI or mpirun is
// not on PATH; the gloo cases are compiled only with gloo built in.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lockstep/config.h"
#include "support/subprocess.h"

namespace lt = lockstep::testing;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

namespace {

void check_every_rank_ok(const lt::ProcessResult& result, int np) {
  INFO(lt::describe(result) << "\n" << result.output);
  CHECK(result.ok());
  for (int r = 0; r < np; ++r)
    CHECK_THAT(result.output, Contains(fmt::format("sync_bn_worker rank {}/{}: OK (", r, np)));
  CHECK_THAT(result.output, !Contains("MISMATCH"));
  CHECK_THAT(result.output, !Contains("FAILED"));
}

// mpirun from PATH (as test_multiprocess_mpi.cpp); empty when there is none.
std::string find_mpirun() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (dir.empty()) continue;
    const std::string candidate = dir + "/mpirun";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

// Empty when the mpi cases can run, else why not.
std::string mpi_skip_reason(const std::string& mpirun) {
  if (LOCKSTEP_HAVE_MPI == 0) {
    return "lockstep built without MPI (install libopenmpi-dev openmpi-bin, configure with "
           "-DLOCKSTEP_MPI=ON)";
  }
  if (mpirun.empty()) return "mpirun not found on PATH (apt-get install openmpi-bin)";
  return {};
}

void run_mpi(int np) {
  const std::string mpirun = find_mpirun();
  if (const auto reason = mpi_skip_reason(mpirun); !reason.empty()) {
    std::cout << "SKIPPED: " << reason << std::endl;
    return;
  }
  // Oversubscribed and unbound (2 cores here), shared memory only; Open MPI
  // refuses root without the two ALLOW variables.
  const std::vector<std::string> argv = {
      mpirun, "--oversubscribe", "-np", std::to_string(np), "--bind-to", "none", "--mca", "btl",
      "self,vader", lt::bin_path("sync_bn_worker"), "--backend", "mpi"};
  check_every_rank_ok(
      lt::run_process(argv, 180s,
                      {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                       "OMPI_MCA_btl_vader_single_copy_mechanism=none", "LOCKSTEP_TIMEOUT_S=60"}),
      np);
}

}  // namespace

#if LOCKSTEP_HAVE_GLOO

namespace {

void run_gloo(int np) {
  const std::vector<std::string> argv = {lt::bin_path("lockstep-run"), "-np", std::to_string(np),
                                         "--tag-output", lt::bin_path("sync_bn_worker"),
                                         "--backend", "gloo"};
  check_every_rank_ok(lt::run_process(argv, 180s, {"LOCKSTEP_TIMEOUT_S=60"}), np);
}

}  // namespace

TEST_CASE("SyncBatchNorm across processes (lockstep-run, gloo): 2 ranks", "[nn][syncbn][gloo]") {
  run_gloo(2);
}

TEST_CASE("SyncBatchNorm across processes (lockstep-run, gloo): 4 ranks, one empty",
          "[nn][syncbn][gloo]") {
  run_gloo(4);
}

#endif  // LOCKSTEP_HAVE_GLOO

TEST_CASE("SyncBatchNorm across processes (mpirun, mpi): 2 ranks", "[nn][syncbn][mpi]") {
  run_mpi(2);
}

TEST_CASE("SyncBatchNorm across processes (mpirun, mpi): 4 ranks, one empty",
          "[nn][syncbn][mpi]") {
  run_mpi(4);
}
