// Slurm for real: each test starts a single-node Slurm of its own
// (tests/launcher/with_slurm.sh: munged, slurmctld and slurmd from Debian's
// packages, as root) and launches ranks with srun and sbatch, with no
// variables of lockstep's own. Skipped, with the reason, where that cannot
// be done.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "train/fashion_mnist_runs.h"
#include "support/subprocess.h"

using lockstep::testing::bin_path;
using lockstep::testing::describe;
using lockstep::testing::ProcessResult;
using lockstep::testing::run_process;
using lockstep::testing::script_skipped;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

namespace {

// `command` (a shell command line) inside a fresh single-node Slurm.
ProcessResult with_slurm(const std::string& command, std::chrono::seconds limit = 120s) {
  const auto script = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/launcher/with_slurm.sh";
  auto r = run_process({"/bin/bash", script, "/bin/bash", "-c", command}, limit);
  UNSCOPED_INFO("with_slurm.sh " << describe(r) << ", output:\n" << r.output);
  return r;
}

}  // namespace

TEST_CASE("slurm: srun -n2 runs every collective with no variables of lockstep's own",
          "[launcher][slurm]") {
  // Rank 0 serves the store on the step's first node at a port from the job
  // and step ids; the local size comes from SLURM_STEP_TASKS_PER_NODE (no
  // --ntasks-per-node given). Two steps in a row get two ports.
  const auto r = with_slurm(fmt::format("srun -n2 {0} print && srun -n2 {1} && srun -n2 {1}",
                                        bin_path("launcher_probe"),
                                        bin_path("collective_worker")));
  if (script_skipped(r)) return;
  CHECK(r.ok());
  CHECK_THAT(r.output, Contains("rank=0 world=2 local=0 local_world=2 node=0 source=slurm"));
  CHECK_THAT(r.output, Contains("rank=1 world=2 local=1 local_world=2 node=0 source=slurm"));
  CHECK_THAT(r.output, Contains("collective_worker rank 0/2: OK") &&
                           Contains("collective_worker rank 1/2: OK"));
}

TEST_CASE("slurm: srun -n2 fashion_mnist trains as lockstep-run -np 2 does", "[launcher][slurm]") {
  SKIP_WITHOUT_FASHION_MNIST();
  const std::vector<std::string> args = {"--epochs",       "1",    "--train-samples", "512",
                                         "--test-samples", "1000", "--batch-size",    "32",
                                         "--log-every",    "4"};
  std::string command = "srun -n2 " + bin_path("fashion_mnist");
  for (const auto& a : args) command += " " + a;
  const auto slurm = lockstep::testing::parse_fashion_mnist(with_slurm(command, 300s));
  if (script_skipped(slurm.result)) return;
  const auto reference = lockstep::testing::run_fashion_mnist(2, args);
  INFO("lockstep-run output:\n" << reference.result.output);
  REQUIRE(reference.result.ok());
  REQUIRE(slurm.result.ok());
  CHECK(slurm.trained());
  CHECK(!slurm.digest.empty());
  CHECK(slurm.digest == reference.digest);
  CHECK(slurm.losses == reference.losses);
}

TEST_CASE("slurm: an sbatch script's shell is one process; its srun steps are the ranks",
          "[launcher][slurm]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("lockstep-sbatch-{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "job.sh") << fmt::format(
      "#!/bin/bash\n"
      "{0} print\n"
      "srun {0} print\n"
      "srun {1}\n",
      bin_path("launcher_probe"), bin_path("collective_worker"));
  const auto r = with_slurm(fmt::format("sbatch --wait -n2 -o {0}/out.txt {0}/job.sh; rc=$?; "
                                        "cat {0}/out.txt; exit $rc",
                                        dir.string()));
  fs::remove_all(dir);
  if (script_skipped(r)) return;
  CHECK(r.ok());
  // The batch shell has SLURM_PROCID=0 and SLURM_NTASKS=2 but is no task.
  CHECK_THAT(r.output, Contains("rank=0 world=1 local=0 local_world=1 node=0 source=none"));
  CHECK_THAT(r.output, Contains("rank=1 world=2 local=1 local_world=2 node=0 source=slurm"));
  CHECK_THAT(r.output, Contains("collective_worker rank 0/2: OK") &&
                           Contains("collective_worker rank 1/2: OK"));
}

TEST_CASE("slurm: srun --mpi=pmix tasks are ranks too", "[launcher][slurm]") {
  const auto r = with_slurm(fmt::format(
      "if ! srun --mpi=list 2>&1 | grep -qw pmix; then echo 'SKIPPED: this Slurm has no pmix "
      "plugin'; exit 0; fi; srun -n2 --mpi=pmix {0} print show=PMIX_RANK && srun -n2 --mpi=pmix {1}",
      bin_path("launcher_probe"), bin_path("collective_worker")));
  if (script_skipped(r)) return;
  CHECK(r.ok());
  CHECK_THAT(r.output, Contains("rank=1 world=2 local=1 local_world=2 node=0 source=slurm "
                                "PMIX_RANK=1"));
  CHECK_THAT(r.output, Contains("collective_worker rank 1/2: OK"));
}

TEST_CASE("slurm: srun --mpi=pmi2 tasks are Slurm's ranks with its store", "[launcher][slurm]") {
  // Where MpiDefault=pmi2, every srun sets PMI_RANK and PMI_SIZE.
  const auto r = with_slurm(fmt::format(
      "if ! srun --mpi=list 2>&1 | grep -qw pmi2; then echo 'SKIPPED: this Slurm has no pmi2 "
      "plugin'; exit 0; fi; srun -n2 --mpi=pmi2 {0} print show=PMI_RANK && "
      "srun -n2 --mpi=pmi2 {1}",
      bin_path("launcher_probe"), bin_path("collective_worker")));
  if (script_skipped(r)) return;
  CHECK(r.ok());
  CHECK_THAT(r.output, Contains("rank=1 world=2 local=1 local_world=2 node=0 source=slurm "
                                "PMI_RANK=1"));
  CHECK_THAT(r.output, Contains("collective_worker rank 1/2: OK"));
}

TEST_CASE("slurm: a killed task ends the step within seconds, named", "[launcher][slurm]") {
  // Task 1 SIGKILLs itself after the first barrier; task 0 is then waiting
  // for it in a collective. Within the limit (the default, which leaves room
  // for the cluster's start on a loaded machine): the group's timeout is 10 min.
  const auto r =
      with_slurm(fmt::format("srun -n2 {} --kill-at-rank 1", bin_path("collective_worker")));
  if (script_skipped(r)) return;
  CHECK_FALSE(r.timed_out);
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.output, Contains("rank 1 (pid"));
  CHECK_THAT(r.output, Contains("task 1: Killed"));
}
