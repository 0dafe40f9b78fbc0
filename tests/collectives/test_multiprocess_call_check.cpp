// The call check and the naming of a hung rank across real processes, on
// the default backend (shm), gloo and mpi, and in the main job: ranks whose
// programs take a different number of steps must fail at once, naming the
// call and what each rank called, not compute on garbage; a rank that stops
// (SIGSTOP) is named by the others, first in a one-line stall report, then
// in the timeout error.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "lockstep/config.h"
#include "lockstep/models/fashion_mnist.h"
#include "support/mpirun.h"
#include "support/subprocess.h"
#include "support/skip.h"

namespace lt = lockstep::testing;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

namespace {

lt::ProcessResult launch(int np, const std::string& backend, const std::vector<std::string>& args,
                         std::chrono::milliseconds limit, std::vector<std::string> env = {}) {
  std::vector<std::string> argv = {lt::bin_path("lockstep-run"), "-np", std::to_string(np),
                                   "--tag-output", lt::bin_path("collective_worker")};
  argv.insert(argv.end(), args.begin(), args.end());
  env.push_back("LOCKSTEP_BACKEND=" + backend);
  return lt::run_process(argv, limit, env);
}

std::vector<std::string> cpu_backends() {
  std::vector<std::string> names = {"shm"};
  if (LOCKSTEP_HAVE_GLOO) names.push_back("gloo");
  return names;
}

}  // namespace

TEST_CASE("across processes: a rank issuing another collective fails every rank at once",
          "[collectives][call_check]") {
  const std::string backend = GENERATE(from_range(cpu_backends()));
  INFO("backend " << backend);
  // The timeout is long: only the check can end this job within the limit.
  const auto result =
      launch(3, backend, {"--diverge-at-rank", "1"}, 60s, {"LOCKSTEP_TIMEOUT_S=600"});
  INFO(lt::describe(result) << "\n" << result.output);
  CHECK_FALSE(result.timed_out);
  CHECK(result.exit_code != 0);
  CHECK_THAT(result.output,
             Contains("collective #2 differs across the ranks of group 'default'") &&
                 Contains("ranks 0 and 2 called allreduce(f32, 1000 elements, sum)") &&
                 Contains("rank 1 called broadcast(f32, 1000 elements, root 0)"));
  CHECK_THAT(result.output, !Contains(": OK ("));
}

TEST_CASE("across processes: a stopped rank is named in a stall line and in the timeout",
          "[collectives][call_check]") {
  const std::string backend = GENERATE(from_range(cpu_backends()));
  INFO("backend " << backend);
  const auto result = launch(2, backend, {"--stop-at-rank", "1"}, 60s,
                             {"LOCKSTEP_TIMEOUT_S=6", "LOCKSTEP_STALL_REPORT_S=1"});
  INFO(lt::describe(result) << "\n" << result.output);
  CHECK_FALSE(result.timed_out);
  CHECK(result.exit_code != 0);
  CHECK_THAT(result.output, Contains("stopping itself with SIGSTOP"));
  // One line while it waits, saying for whom and where that rank stopped...
  CHECK_THAT(result.output, Contains("has waited 1 s for other ranks: rank 1") &&
                                Contains("the last collective it") && Contains("was #1 barrier()"));
  // ...and the timeout names it too, not "some rank".
  const auto failed = result.output.find("FAILED:");
  REQUIRE(failed != std::string::npos);
  const std::string error = result.output.substr(failed);
  CHECK_THAT(error, Contains("timed out after 6 s") && Contains("rank 1") &&
                        Contains("did not join it") && !Contains("some rank"));
}

TEST_CASE("mpi across processes: allreduce(i64, 2) against allreduce(f32, 1000) fails every rank",
          "[collectives][call_check][mpi]") {
  LOCKSTEP_SKIP_IF(lt::mpi_skip_reason());
  const auto result =
      lt::run_under_mpirun(3, "mpi_collective_worker", {"--diverge-at-rank", "2"}, 60s);
  INFO(lt::describe(result) << "\n" << result.output);
  CHECK_FALSE(result.timed_out);
  CHECK(result.exit_code != 0);
  CHECK_THAT(result.output,
             Contains("collective #1 differs across the ranks of group 'default' (mpi") &&
                 Contains("ranks 0 and 1 called allreduce(f32, 1000 elements, sum)") &&
                 Contains("rank 2 called allreduce(i64, 2 elements, sum)"));
}

TEST_CASE("the main job: ranks given different batch sizes fail naming the call, not garbage",
          "[collectives][call_check]") {
  namespace fs = std::filesystem;
  if (!fs::exists(fs::path(lockstep::models::kFashionMnistDir) / "train-images-idx3-ubyte.gz") ||
      !fs::exists(lt::bin_path("fashion_mnist"))) {
    std::cout << "SKIPPED: needs the Fashion-MNIST data (apt-get install dataset-fashion-mnist) "
                 "and the fashion_mnist example"
              << std::endl;
    return;
  }
  // Rank 1 gets smaller batches of the same samples, so more steps (the
  // sampler checks the sample counts agree, not the batch size): when rank 0
  // ends its epoch (its first collective there averages the log window's loss
  // over the ranks, an all-reduce of 2 f64 values), rank 1 still all-reduces
  // its gradients.
  const std::string program = lt::bin_path("fashion_mnist");
  const std::string script = fmt::format(
      "if [ \"$LOCKSTEP_RANK\" = 1 ]; then b=32; else b=64; fi; exec {} --model mlp "
      "--batch-size $b --train-samples 256 --log-every 100",
      program);
  const auto result =
      lt::run_process({lt::bin_path("lockstep-run"), "-np", "2", "sh", "-c", script}, 120s,
                      {"LOCKSTEP_TIMEOUT_S=600", "LOCKSTEP_BACKEND=shm"});
  INFO(lt::describe(result) << "\n" << result.output);
  CHECK_FALSE(result.timed_out);
  CHECK(result.exit_code != 0);
  CHECK_THAT(result.output, Contains("differs across the ranks of group 'default'") &&
                                Contains("called allreduce(f64, 2 elements, sum)") &&
                                Contains("called allreduce(f32, "));
  CHECK_THAT(result.output, !Contains("test accuracy"));
}
