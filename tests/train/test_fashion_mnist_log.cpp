// fashion_mnist --log-json across a resume: the curve the run wrote before
// stays in the file, and the resumed run adds to it.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/fashion_mnist_runs.h"

using namespace lockstep::testing;
namespace fs = std::filesystem;

namespace {

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::vector<int64_t> steps_of(const nlohmann::json& entries) {
  std::vector<int64_t> steps;
  for (const auto& e : entries) steps.push_back(e.at("step").get<int64_t>());
  return steps;
}

}  // namespace

TEST_CASE("fashion_mnist --log-json: a resumed run keeps the epochs logged before the resume",
          "[optim][example][resume]") {
  SKIP_WITHOUT_FASHION_MNIST();
  const std::string dir = fresh_checkpoint_dir("log-json");
  const fs::path log = fs::path(dir + "-log.json");
  const std::vector<std::string> quick = {"--train-samples", "256", "--test-samples", "100",
                                          "--log-every",     "2",   "--checkpoint-dir", dir,
                                          "--log-json",      log.string()};
  std::vector<std::string> first = quick;
  first.insert(first.end(), {"--epochs", "1"});
  const FashionMnistRun one = run_fashion_mnist(1, first);
  INFO(one.result.output);
  REQUIRE(one.result.ok());
  const nlohmann::json before = read_json(log);
  REQUIRE(steps_of(before.at("epochs")) == std::vector<int64_t>{4});

  std::vector<std::string> second = quick;
  second.insert(second.end(), {"--epochs", "2", "--resume"});
  const FashionMnistRun two = run_fashion_mnist(1, second);
  INFO(two.result.output);
  REQUIRE(two.result.ok());
  const nlohmann::json after = read_json(log);
  // The resumed run used to replace the file with its own epoch only.
  CHECK(steps_of(after.at("windows")) == std::vector<int64_t>{2, 4, 6, 8});
  CHECK(steps_of(after.at("epochs")) == std::vector<int64_t>{4, 8});
  CHECK(after.at("epochs")[0] == before.at("epochs")[0]);
  CHECK(after.at("settings").at("epochs") == 2);
  // Elapsed time goes on from the earlier run's.
  CHECK(after.at("windows")[2].at("elapsed_s").get<double>() >=
        before.at("epochs")[0].at("elapsed_s").get<double>());
  fs::remove_all(dir);
  fs::remove(log);
}

TEST_CASE("fashion_mnist: a run resumed inside a --log-every window logs the losses an "
          "uninterrupted one does, on one rank and on two", "[optim][example][resume]") {
  SKIP_WITHOUT_FASHION_MNIST();
  // Two ranks of 32: the checkpoint holds the ranks' mean window, which every
  // rank goes on from.
  for (const auto& [ranks, batch] : {std::pair{1, "64"}, std::pair{2, "32"}}) {
    INFO(ranks << " rank(s)");
    const std::string dir = fresh_checkpoint_dir(fmt::format("log-window-{}", ranks));
    const std::vector<std::string> args = {
        "--train-samples", "640", "--test-samples",     "100", "--batch-size", batch,
        "--log-every",     "4",   "--checkpoint-every", "3",   "--keep-last",  "10",
        "--checkpoint-dir", dir};
    const FashionMnistRun straight = run_fashion_mnist(ranks, args);
    INFO(straight.result.output);
    REQUIRE(straight.result.ok());
    REQUIRE(straight.losses.size() == 3);  // steps 4, 8 and 10 of the epoch's 10
    // Back to the step-3 checkpoint: three steps into the window logged at step 4.
    for (const char* later : {"06", "09", "10"})
      REQUIRE(fs::remove(fs::path(dir) / fmt::format("ckpt-00000000{}.safetensors", later)));
    std::vector<std::string> again = args;
    again.push_back("--resume");
    const FashionMnistRun resumed = run_fashion_mnist(ranks, again);
    INFO(resumed.result.output);
    REQUIRE(resumed.result.ok());
    CHECK_THAT(resumed.result.output, Catch::Contains("resumed from"));
    // Step 4's line is the mean of steps 1 to 4; it used to be step 4's loss alone.
    CHECK(resumed.losses == straight.losses);
    CHECK(resumed.digest == straight.digest);
    fs::remove_all(dir);
  }
}

TEST_CASE("fashion_mnist --log-json: a run killed mid-epoch and resumed keeps every window "
          "up to its checkpoint", "[optim][example][resume]") {
  SKIP_WITHOUT_FASHION_MNIST();
  const std::string dir = fresh_checkpoint_dir("log-json-kill");
  const fs::path log = fs::path(dir + "-log.json");
  // 4096 samples in batches of 32: 128 steps, the first epoch far from its end
  // when the kill comes after the step-8 checkpoint.
  const std::vector<std::string> args = {
      "--train-samples", "4096", "--test-samples", "100",       "--batch-size", "32",
      "--log-every",     "2",    "--checkpoint-every", "4",    "--keep-last",  "50",
      "--checkpoint-dir", dir,   "--log-json",     log.string()};
  const ProcessResult killed = run_until_file_then_kill(fashion_mnist_command(1, args),
                                                        dir + "/ckpt-0000000008.safetensors");
  INFO(killed.output);
  std::vector<std::string> again = args;
  again.push_back("--resume");
  const FashionMnistRun resumed = run_fashion_mnist(1, again);
  INFO(resumed.result.output);
  REQUIRE(resumed.result.ok());
  CHECK_THAT(resumed.result.output, Catch::Contains("resumed from"));
  // Every window of the run, once: those before the resume used to be lost
  // with the file, written only at the end of an epoch.
  std::vector<int64_t> every;
  for (int64_t step = 2; step <= 128; step += 2) every.push_back(step);
  const nlohmann::json after = read_json(log);
  CHECK(steps_of(after.at("windows")) == every);
  CHECK(steps_of(after.at("epochs")) == std::vector<int64_t>{128});
  fs::remove_all(dir);
  fs::remove(log);
}

TEST_CASE("fashion_mnist logs the loss of the global batch: two ranks of 32 log what one "
          "process of 64 does", "[optim][example]") {
  SKIP_WITHOUT_FASHION_MNIST();
  // The same global batches in the same order (the sampler deals positions
  // rank, rank + 2, ...), so the same training up to rounding.
  const std::vector<std::string> common = {"--train-samples", "640", "--test-samples", "100",
                                           "--log-every", "1"};
  std::vector<std::string> one_args = common, two_args = common;
  one_args.insert(one_args.end(), {"--batch-size", "64"});
  two_args.insert(two_args.end(), {"--batch-size", "32"});
  const FashionMnistRun one = run_fashion_mnist(1, one_args);
  INFO(one.result.output);
  REQUIRE(one.result.ok());
  const FashionMnistRun two = run_fashion_mnist(2, two_args);
  INFO(two.result.output);
  REQUIRE(two.result.ok());
  REQUIRE(one.losses.size() == 10);
  REQUIRE(two.losses.size() == one.losses.size());
  // Rank 0 used to log the loss of its own half of each batch.
  for (const auto& [step, loss] : one.losses) {
    INFO(step);
    CHECK(std::stod(two.losses.at(step)) == Approx(std::stod(loss)).margin(1e-4));
  }
}

TEST_CASE("fashion_mnist: two ranks resumed after the last epoch report the test accuracy the "
          "run reported, BatchNorm's statistics included", "[optim][example][resume]") {
  SKIP_WITHOUT_FASHION_MNIST();
  // Without --sync-bn each rank's last forward updates its own running
  // statistics; the checkpoint holds rank 0's.
  const std::regex accuracy_line("\ntest accuracy: ([0-9.]+)");
  for (const char* seed : {"1", "3"}) {
    INFO("seed " << seed);
    const std::string dir = fresh_checkpoint_dir(std::string("bn-accuracy-") + seed);
    const std::vector<std::string> args = {
        "--model", "cnn", "--train-samples", "256", "--test-samples", "2000", "--batch-size",
        "16", "--lr", "0.2", "--seed", seed, "--checkpoint-dir", dir};
    const FashionMnistRun run = run_fashion_mnist(2, args);
    INFO(run.result.output);
    REQUIRE(run.result.ok());
    std::vector<std::string> again = args;
    again.push_back("--resume");
    const FashionMnistRun resumed = run_fashion_mnist(2, again);
    INFO(resumed.result.output);
    REQUIRE(resumed.result.ok());
    std::smatch before, after;
    REQUIRE(std::regex_search(run.result.output, before, accuracy_line));
    REQUIRE(std::regex_search(resumed.result.output, after, accuracy_line));
    // Ranks other than 0 used to classify with their own statistics.
    CHECK(after[1] == before[1]);
    CHECK(resumed.digest == run.digest);
    fs::remove_all(dir);
  }
}
