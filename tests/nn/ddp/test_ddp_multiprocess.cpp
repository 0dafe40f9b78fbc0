// DDP's promises in real processes (tests/workers/ddp_worker.cpp): through
// lockstep-run over the default backend (shm) and gloo, and through mpirun
// over mpi, at 2 and 4 ranks.
#include <catch2/catch.hpp>

#include <chrono>
#include <iostream>
#include <string>

#include <fmt/format.h>

#include "support/mpirun.h"
#include "support/subprocess.h"
#include "support/backend_skip.h"
#include "support/skip.h"

namespace lt = lockstep::testing;
using namespace std::chrono_literals;

namespace {

void require_every_rank_ok(const lt::ProcessResult& result, int ranks) {
  INFO(lt::describe(result) << "\n" << result.output);
  REQUIRE(result.ok());
  for (int r = 0; r < ranks; ++r) {
    REQUIRE(result.output.find(fmt::format("ddp_worker rank {}/{}: OK (50 checks)", r, ranks)) !=
            std::string::npos);
  }
}

}  // namespace

TEST_CASE("DDP promises across processes: the default backend (shm) through lockstep-run",
          "[ddp][multiprocess][shm]") {
  const int ranks = GENERATE(2, 4);
  const auto result = lt::run_process(
      {lt::bin_path("lockstep-run"), "-np", std::to_string(ranks), lt::bin_path("ddp_worker")},
      120s);
  require_every_rank_ok(result, ranks);
  REQUIRE(result.output.find("backend shm") != std::string::npos);
}

TEST_CASE("DDP promises across processes: gloo through lockstep-run", "[ddp][multiprocess]") {
  LOCKSTEP_SKIP_UNLESS_BACKEND("gloo");
  const int ranks = GENERATE(2, 4);
  const auto result = lt::run_process({lt::bin_path("lockstep-run"), "-np", std::to_string(ranks),
                                       lt::bin_path("ddp_worker"), "--backend", "gloo"},
                                      120s);
  require_every_rank_ok(result, ranks);
}

TEST_CASE("DDP promises across processes: mpi through mpirun", "[ddp][multiprocess][mpi]") {
  LOCKSTEP_SKIP_IF(lt::mpi_skip_reason());
  const int ranks = GENERATE(2, 4);
  require_every_rank_ok(lt::run_under_mpirun(ranks, "ddp_worker", {"--backend", "mpi"}, 120s),
                        ranks);
}

TEST_CASE("DDP across processes: ranks with different models fail at construction",
          "[ddp][multiprocess]") {
  const auto result =
      lt::run_process({lt::bin_path("lockstep-run"), "-np", "3", lt::bin_path("ddp_worker"),
                       "--mismatch-rank", "2"},
                      60s);
  INFO(lt::describe(result) << "\n" << result.output);
  REQUIRE(result.exit_code != 0);
  REQUIRE_FALSE(result.timed_out);
  REQUIRE(result.output.find("the ranks hold different models. Parameter #0: rank 0 holds "
                             "'0.weight' [32, 1, 3, 3] f32; rank 2 holds '1.weight'") !=
          std::string::npos);
}
