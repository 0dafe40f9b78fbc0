// torchrun for real: ranks started by PyTorch's own launcher (Debian's
// python3-torch), in its default static rendezvous, whose agent serves its
// own store on MASTER_PORT, and with --standalone. Skipped, with the reason,
// where torchrun cannot run.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "train/fashion_mnist_runs.h"
#include "support/subprocess.h"
#include "support/backend_skip.h"
#include "support/skip.h"

using lockstep::testing::bin_path;
using lockstep::testing::describe;
using lockstep::testing::ProcessResult;
using lockstep::testing::run_process;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

namespace {

std::string torchrun_skip_reason() {
  const auto r = run_process({"/bin/sh", "-c", "torchrun --help >/dev/null 2>&1 || "
                                               "/usr/bin/torchrun --help >/dev/null"}, 60s);
  if (!r.ok())
    return "torchrun does not run here (apt-get install python3-torch): " + describe(r);
  return {};
}

#define SKIP_WITHOUT_TORCHRUN() LOCKSTEP_SKIP_IF(torchrun_skip_reason())

// The shell words that start torchrun on binaries, its logs in `log_dir`.
// Debian's torchrun (PyTorch 1.13, Python 3.11) needs --no_python to start a
// binary, and fails in its own option parsing without --redirects and --tee.
std::string torchrun_command(const std::string& log_dir) {
  return "\"$(command -v torchrun || echo /usr/bin/torchrun)\" --no_python --redirects 1 --tee 1 "
         "--log_dir " + log_dir;
}

// torchrun with 2 workers on this node running `program`; `mode` are
// torchrun's rendezvous options.
ProcessResult torchrun(const std::vector<std::string>& mode, const std::vector<std::string>& program,
                       std::chrono::seconds limit = 120s) {
  namespace fs = std::filesystem;
  const fs::path logs = fs::temp_directory_path() / fmt::format("lockstep-torchrun-{}", ::getpid());
  fs::remove_all(logs);
  std::string command = "exec " + torchrun_command(logs.string()) + " --nproc_per_node 2";
  for (const auto& word : mode) command += " " + word;
  for (const auto& word : program) command += " " + word;
  auto r = run_process({"/bin/sh", "-c", command}, limit);
  fs::remove_all(logs);
  UNSCOPED_INFO("torchrun " << describe(r) << ", output:\n" << r.output);
  return r;
}

// The static rendezvous on a port of this test's own (lockstep's store takes
// the next one).
std::vector<std::string> static_rendezvous() {
  return {"--master_addr", "127.0.0.1", "--master_port",
          std::to_string(lockstep::testing::unused_tcp_port_pair())};
}

}  // namespace

TEST_CASE("torchrun: the default (static) rendezvous runs every collective", "[launcher][torchrun]") {
  SKIP_WITHOUT_TORCHRUN();
  const auto r = torchrun(static_rendezvous(), {bin_path("collective_worker")});
  CHECK(r.ok());
  CHECK_THAT(r.output, Contains("collective_worker rank 0/2: OK") &&
                           Contains("collective_worker rank 1/2: OK"));
}

TEST_CASE("torchrun: --standalone runs every collective", "[launcher][torchrun]") {
  SKIP_WITHOUT_TORCHRUN();
  const auto r = torchrun({"--standalone"}, {bin_path("collective_worker")});
  CHECK(r.ok());
  CHECK_THAT(r.output, Contains("collective_worker rank 1/2: OK"));
}

TEST_CASE("torchrun: fashion_mnist trains as under lockstep-run", "[launcher][torchrun]") {
  SKIP_WITHOUT_TORCHRUN();
  SKIP_WITHOUT_FASHION_MNIST();
  const std::vector<std::string> args = {"--epochs",       "1",    "--train-samples", "512",
                                         "--test-samples", "1000", "--batch-size",    "32",
                                         "--log-every",    "4"};
  std::vector<std::string> program = {bin_path("fashion_mnist")};
  program.insert(program.end(), args.begin(), args.end());
  const auto run =
      lockstep::testing::parse_fashion_mnist(torchrun(static_rendezvous(), program, 300s));
  const auto reference = lockstep::testing::run_fashion_mnist(2, args);
  INFO("lockstep-run output:\n" << reference.result.output);
  REQUIRE(reference.result.ok());
  REQUIRE(run.result.ok());
  CHECK(run.trained());
  CHECK(!run.digest.empty());
  CHECK(run.digest == reference.digest);
  CHECK(run.losses == reference.losses);
}

TEST_CASE("torchrun: a killed worker ends the job, named", "[launcher][torchrun]") {
  SKIP_WITHOUT_TORCHRUN();
  const auto r = torchrun(static_rendezvous(), {bin_path("collective_worker"), "--kill-at-rank", "1"},
                          60s);
  CHECK_FALSE(r.timed_out);
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.output, Contains("rank 1 (pid"));
}

TEST_CASE("torchrun: two nodes in two network namespaces", "[launcher][torchrun]") {
  // One torchrun per namespace in the static rendezvous; rank 0 serves
  // lockstep's store beside node 0's agent store, on node 0's veth address
  // only, and the ranks run every gloo collective across the link.
  SKIP_WITHOUT_TORCHRUN();
  LOCKSTEP_SKIP_UNLESS_BACKEND("gloo");
  const auto script = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/launcher/two_node_test.sh";
  const auto r = run_process(
      {"/bin/bash", script,
       fmt::format("logs=$(mktemp -d); {} --nnodes 2 --node_rank $NODE_RANK --nproc_per_node 1 "
                   "--master_addr $NODE0_ADDR --master_port 29500 {} --backend gloo; "
                   "rc=$?; rm -rf $logs; exit $rc",
                   torchrun_command("$logs"), bin_path("collective_worker"))},
      150s);
  INFO(describe(r) << "\n" << r.output);
  if (lockstep::testing::script_skipped(r)) return;
  CHECK(r.ok());
  CHECK_THAT(r.output, Contains("collective_worker rank 0/2: OK") &&
                           Contains("collective_worker rank 1/2: OK"));
}
