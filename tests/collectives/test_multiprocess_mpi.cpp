// The mpi backend in real processes: mpirun starts tests/workers/
// mpi_collective_worker, which checks every collective, dtype and reduce op
// itself and prints one OK line per rank. Skipped (prints "SKIPPED: ...") when
// lockstep is built without MPI or mpirun is not on PATH.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lockstep/config.h"
#include "support/mpirun.h"
#include "support/subprocess.h"
#include "support/skip.h"

namespace {

using lockstep::testing::bin_path;
using lockstep::testing::describe;
using lockstep::testing::ProcessResult;
using lockstep::testing::run_process;

std::string find_mpirun() { return lockstep::testing::find_mpirun(); }
std::string skip_reason(const std::string&) { return lockstep::testing::mpi_skip_reason(); }

ProcessResult run_worker(const std::string&, int ranks, const std::vector<std::string>& worker_args,
                         std::chrono::seconds limit) {
  return lockstep::testing::run_under_mpirun(ranks, "mpi_collective_worker", worker_args, limit);
}

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

void check_every_rank_ok(int ranks) {
  const std::string mpirun = find_mpirun();
  LOCKSTEP_SKIP_IF(skip_reason(mpirun));
  const auto result = run_worker(mpirun, ranks, {}, std::chrono::seconds(180));
  INFO("mpirun: " << describe(result) << "\n" << result.output);
  CHECK(result.ok());
  for (int r = 0; r < ranks; ++r) {
    CHECK(contains(result.output, fmt::format("mpi_collective_worker rank {}/{}: OK (", r, ranks)));
  }
  CHECK_FALSE(contains(result.output, "FAILED"));
}

}  // namespace

TEST_CASE("mpi backend: every collective, dtype and op is exact on 2 ranks",
          "[collectives][mpi]") {
  check_every_rank_ok(2);
}

TEST_CASE("mpi backend: every collective, dtype and op is exact on 4 ranks",
          "[collectives][mpi]") {
  check_every_rank_ok(4);
}

TEST_CASE("mpi backend: a rank that exits early ends the job, naming its exit code",
          "[collectives][mpi]") {
  const std::string mpirun = find_mpirun();
  LOCKSTEP_SKIP_IF(skip_reason(mpirun));
  // The others wait in their first collective; their own timeout (200 s) is
  // beyond the limit, so the job ending at all means mpirun stopped them.
  const auto result = run_worker(mpirun, 4, {"--die-at-rank", "1", "--timeout-ms", "200000"},
                                 std::chrono::seconds(120));
  INFO("mpirun: " << describe(result) << "\n" << result.output);
  CHECK_FALSE(result.timed_out);
  CHECK(result.exit_code != 0);
  CHECK(contains(result.output, "mpi_collective_worker rank 1/4: exiting with code 3"));
  CHECK_FALSE(contains(result.output, ": OK ("));
  // mpirun's own report: Open MPI prints "Process name: [[job,1],1]" and
  // "Exit code:    3"; MPICH "EXIT CODE: 3".
  CHECK(std::regex_search(result.output, std::regex(R"(exit code:?\s*3\b)", std::regex::icase)));
  if (contains(result.output, "Process name:")) {
    CHECK(std::regex_search(result.output, std::regex(R"(Process name: \[\[\d+,\d+\],1\])")));
  }
}

TEST_CASE("mpi backend: a timed-out collective names the op, rank and group and aborts the group",
          "[collectives][mpi]") {
  const std::string mpirun = find_mpirun();
  LOCKSTEP_SKIP_IF(skip_reason(mpirun));
  // Rank 0 alone issues a barrier with a 300 ms timeout; the worker checks
  // the error's text and that later calls fail at once. That barrier never
  // completes, so rank 0 skips MPI_Finalize and the job ends non-zero.
  const auto result = run_worker(mpirun, 2, {"--timeout-case"}, std::chrono::seconds(120));
  INFO("mpirun: " << describe(result) << "\n" << result.output);
  CHECK_FALSE(result.timed_out);
  CHECK(contains(result.output, "mpi_collective_worker rank 0/2: timeout case OK"));
  CHECK(contains(result.output, "mpi_collective_worker rank 0/2: OK ("));
  CHECK(contains(result.output, "mpi_collective_worker rank 1/2: OK ("));
  CHECK(contains(result.output, "not calling MPI_Finalize on rank 0"));
  CHECK(result.exit_code != 0);
}

TEST_CASE("mpi backend: a timed-out recv names its peer and tag, not a collective",
          "[collectives][mpi]") {
  const std::string mpirun = find_mpirun();
  LOCKSTEP_SKIP_IF(skip_reason(mpirun));
  // Rank 0 alone issues a recv from rank 1 with a 300 ms timeout; the worker
  // checks the error's text. That recv never completes, so rank 0 skips
  // MPI_Finalize and the job ends non-zero.
  const auto result = run_worker(mpirun, 2, {"--p2p-timeout-case"}, std::chrono::seconds(120));
  INFO("mpirun: " << describe(result) << "\n" << result.output);
  CHECK_FALSE(result.timed_out);
  CHECK(contains(result.output, "mpi_collective_worker rank 0/2: p2p timeout case OK"));
  CHECK(contains(result.output, "mpi_collective_worker rank 0/2: OK ("));
  CHECK(contains(result.output, "mpi_collective_worker rank 1/2: OK ("));
  CHECK(result.exit_code != 0);
}

TEST_CASE("mpi backend: new_group over the job's odd ranks of 4 reduces among them",
          "[collectives][mpi][new_group]") {
  const std::string mpirun = find_mpirun();
  LOCKSTEP_SKIP_IF(skip_reason(mpirun));
  const auto result = run_worker(mpirun, 4, {"--new-group-case", "--timeout-ms", "60000"},
                                 std::chrono::seconds(180));
  INFO("mpirun: " << describe(result) << "\n" << result.output);
  CHECK(result.ok());
  for (int r = 0; r < 4; ++r)
    CHECK(contains(result.output, fmt::format("rank {}/4: new_group case OK", r)));
}
