// Exact resume, end to end: fashion_mnist on the real dataset (2048 training
// and 1000 test samples, so each run takes seconds), trained 2 epochs straight against 1
// epoch, exit, and --resume for the second; and against a run SIGKILLed
// mid-epoch and resumed from its newest checkpoint. The resumed runs must end
// with bit-identical parameters (the program prints a digest of every byte)
// and log the same loss at every step after the resume point. World sizes 1
// and 2, plain optimizer and ZeRO.
#include <catch2/catch.hpp>

#include <filesystem>

#include <fmt/format.h>

#include "train/fashion_mnist_runs.h"
#include "support/test_util.h"

using namespace lockstep::testing;
namespace fs = std::filesystem;

namespace {

using Run = FashionMnistRun;

std::vector<std::string> command(int ranks, const std::vector<std::string>& args) {
  std::vector<std::string> all = {"--model",        "mlp",  "--train-samples", "2048",
                                  "--test-samples", "1000", "--batch-size",    "64",
                                  "--log-every",    "1",    "--optimizer",     "adam"};
  all.insert(all.end(), args.begin(), args.end());
  return fashion_mnist_command(ranks, all);
}

Run train(int ranks, const std::vector<std::string>& args) {
  Run run = parse_fashion_mnist(run_process(command(ranks, args), std::chrono::seconds(300)));
  INFO(run.result.output);
  REQUIRE(run.result.ok());
  REQUIRE(!run.digest.empty());
  return run;
}

// Every loss the resumed run logged equals the straight run's at that step.
void check_same_losses(const Run& straight, const Run& resumed, size_t at_least) {
  size_t compared = 0;
  for (const auto& [where, value] : resumed.losses) {
    INFO(where);
    REQUIRE(straight.losses.contains(where));
    CHECK(straight.losses.at(where) == value);
    ++compared;
  }
  CHECK(compared >= at_least);
}

void epoch_boundary_resume(int ranks, bool zero) {
  std::vector<std::string> extra = {"--lr-schedule", "step"};
  if (zero) extra.push_back("--zero");
  auto with = [&](std::vector<std::string> args) {
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  const Run straight = train(ranks, with({"--epochs", "2"}));
  const std::string dir = fresh_checkpoint_dir(fmt::format("{}{}", ranks, zero ? "z" : ""));
  const Run first = train(ranks, with({"--epochs", "1", "--checkpoint-dir", dir}));
  const Run resumed = train(ranks, with({"--epochs", "2", "--checkpoint-dir", dir, "--resume"}));
  INFO(resumed.result.output);
  CHECK_THAT(resumed.result.output, Catch::Contains("resumed from"));
  // Epoch 1 identical too: the checkpointing run trained like the straight one.
  check_same_losses(straight, first, 1);
  check_same_losses(straight, resumed, 2048 / 64 / ranks);
  CHECK(resumed.digest == straight.digest);
  fs::remove_all(dir);
}

}  // namespace

TEST_CASE("Resume after an epoch is exact: one process", "[optim][checkpoint][resume]") {
  SKIP_WITHOUT_FASHION_MNIST();
  epoch_boundary_resume(1, false);
}

TEST_CASE("Resume after an epoch is exact: two ranks", "[optim][checkpoint][resume]") {
  SKIP_WITHOUT_FASHION_MNIST();
  epoch_boundary_resume(2, false);
}

TEST_CASE("Resume after an epoch is exact: two ranks with ZeRO", "[optim][checkpoint][resume][zero]") {
  SKIP_WITHOUT_FASHION_MNIST();
  epoch_boundary_resume(2, true);
}

TEST_CASE("Resume after an epoch is exact: one process with ZeRO", "[optim][checkpoint][resume][zero]") {
  SKIP_WITHOUT_FASHION_MNIST();
  epoch_boundary_resume(1, true);
}

TEST_CASE("A run SIGKILLed mid-epoch resumes exactly from its newest checkpoint",
          "[optim][checkpoint][resume]") {
  SKIP_WITHOUT_FASHION_MNIST();
  for (int ranks : {1, 2}) {
    DYNAMIC_SECTION(ranks << " rank(s)") {
      const std::vector<std::string> args = {"--epochs", "2", "--lr-schedule", "cosine"};
      const Run straight = train(ranks, args);
      const std::string dir = fresh_checkpoint_dir(fmt::format("kill{}", ranks));
      auto with_dir = args;
      for (const char* a : {"--checkpoint-dir", "", "--checkpoint-every", "5"}) with_dir.push_back(a);
      with_dir[with_dir.size() - 3] = dir;
      // SIGKILL the ranks and the launcher once the step-20 checkpoint
      // exists: the run dies somewhere after that step, mid-epoch.
      const ProcessResult killed =
          run_until_file_then_kill(command(ranks, with_dir), dir + "/ckpt-0000000020.safetensors");
      INFO(killed.output);
      REQUIRE(killed.exit_code == 0);  // bash's own
      CHECK(killed.output.find("parameters digest") == std::string::npos);  // it did not finish

      auto resume_args = with_dir;
      resume_args.push_back("--resume");
      const Run resumed = train(ranks, resume_args);
      INFO(resumed.result.output);
      CHECK_THAT(resumed.result.output, Catch::Contains("resumed from"));
      check_same_losses(straight, resumed, 1);
      CHECK(resumed.digest == straight.digest);
      fs::remove_all(dir);
    }
  }
}

TEST_CASE("lockstep-run --max-restarts: a rank SIGKILLed mid-epoch is restarted and the run "
          "ends exactly as an uninterrupted one",
          "[optim][checkpoint][resume][restart]") {
  SKIP_WITHOUT_FASHION_MNIST();
  const std::vector<std::string> args = {"--epochs", "2", "--lr-schedule", "cosine"};
  const Run straight = train(2, args);
  const std::string dir = fresh_checkpoint_dir("restart");
  std::vector<std::string> argv = command(2, args);
  // lockstep-run -np 2 --max-restarts 1 --restart-backoff 0 fashion_mnist ...
  argv.insert(argv.begin() + 3, {"--max-restarts", "1", "--restart-backoff", "0"});
  for (const char* a : {"--checkpoint-dir", "", "--checkpoint-every", "5"}) argv.emplace_back(a);
  argv[argv.size() - 3] = dir;
  // Rank 0 or 1 dies somewhere after the step-20 checkpoint, mid-epoch; the
  // launcher stops the other and starts both again, which resume by themselves.
  const Run restarted = parse_fashion_mnist(run_until_file_then_kill_rank(
      argv, dir + "/ckpt-0000000020.safetensors", "fashion_mnist"));
  INFO(restarted.result.output);
  CHECK_THAT(restarted.result.output,
             Catch::Contains("was killed by SIGKILL") &&
                 Catch::Contains("restart 1 of 1: starting the 2 ranks again") &&
                 Catch::Contains("restart 1 (LOCKSTEP_RESTART_COUNT): resuming the run in") &&
                 Catch::Contains("resumed from") && Catch::Contains("launcher exit 0"));
  check_same_losses(straight, restarted, 1);
  CHECK(restarted.digest == straight.digest);
  fs::remove_all(dir);
}

TEST_CASE("chaos: ranks SIGKILLed at start-up, in a checkpoint write and in training, under "
          "--max-restarts, end bit for bit as an uninterrupted run",
          "[optim][checkpoint][resume][restart]") {
  SKIP_WITHOUT_FASHION_MNIST();
  LOCKSTEP_SKIP_IF(std::filesystem::exists("/usr/bin/python3")
                       ? std::string()
                       : "no /usr/bin/python3 to run benchmarks/chaos_restart.py");
  // benchmarks/chaos_restart.py: a straight run, a checkpointed one, and one
  // whose ranks it kills 3 times; it compares digests and per-step losses.
  const ProcessResult r = run_process(
      {"/usr/bin/python3", std::string(LOCKSTEP_SOURCE_DIR) + "/benchmarks/chaos_restart.py",
       "--build", LOCKSTEP_BINARY_DIR, "--kills", "3", "--quick"},
      std::chrono::seconds(600));
  INFO(describe(r) << "\n" << r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("3 of 3 asked") && Catch::Contains("\"digest_equal\": true") &&
                           Catch::Contains("\"restarts\": 3") && Catch::Contains("PASSED"));
}
