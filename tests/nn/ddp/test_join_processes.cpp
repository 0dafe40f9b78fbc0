// nn::Join across real processes: lockstep-run starts three
// tests/workers/join_worker ranks (shards of 2, 4 and 7 batches, over the
// default backend), and each checks itself against the one-process run and
// the other ranks' bits (nn/ddp/join_fixture.h).
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "support/subprocess.h"

namespace lt = lockstep::testing;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

namespace {

void run_joined(const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {lt::bin_path("lockstep-run"), "-np", "3",
                                   lt::bin_path("join_worker")};
  argv.insert(argv.end(), flags.begin(), flags.end());
  const auto r = lt::run_process(argv, 120s, {"LOCKSTEP_TIMEOUT_S=60"});
  INFO(lt::describe(r) << "\n" << r.output);
  CHECK(r.ok());
  for (int rank = 0; rank < 3; ++rank) {
    CHECK_THAT(r.output, Contains(fmt::format("join_worker rank {}/3: OK (7 iterations, active "
                                              "ranks 3 3 2 2 1 1 1)",
                                              rank)));
  }
  CHECK_THAT(r.output, !Contains("MISMATCH") && !Contains("FAILED"));
}

}  // namespace

TEST_CASE("Join across processes: SyncBatchNorm + DDP + SGD on shards of 2, 4 and 7 batches "
          "equals the one-process run",
          "[ddp][join][multiprocess]") {
  run_joined({});
}

TEST_CASE("Join across processes: per-rank BatchNorm + DDP + ZeRO on shards of 2, 4 and 7 "
          "batches equals the one-process run",
          "[ddp][join][multiprocess][zero]") {
  run_joined({"--batch-norm", "--zero"});
}
