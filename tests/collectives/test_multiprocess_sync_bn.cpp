// SyncBatchNorm across real processes: lockstep-run (gloo) or mpirun (mpi)
// starts tests/workers/sync_bn_worker, which compares SyncBatchNorm with
// BatchNorm on the global batch itself (uneven local batches, an empty rank
// from 3 ranks on) and prints one OK line per rank. The mpi cases are skipped
// (printing "SKIPPED: ...") when lockstep is built without MPI or mpirun is
// not on PATH; the gloo cases are compiled only with gloo built in.
#include <catch2/catch.hpp>

#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lockstep/config.h"
#include "support/mpirun.h"
#include "support/subprocess.h"
#include "support/skip.h"

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

void run_mpi(int np) {
  LOCKSTEP_SKIP_IF(lt::mpi_skip_reason());
  check_every_rank_ok(lt::run_under_mpirun(np, "sync_bn_worker", {"--backend", "mpi"}, 180s,
                                           {"LOCKSTEP_TIMEOUT_S=60"}),
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
