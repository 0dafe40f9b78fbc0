// fashion_mnist's --device, end to end: on a machine without a GPU, cuda is
// refused before anything is loaded and auto trains exactly as cpu; on GPUs
// (tagged [gpu], skipped elsewhere with the reason) the main job reaches the
// CPU's accuracy bar on one GPU and on two ranks sharing one, and a
// checkpoint written on a GPU resumes on the CPU.
#include <catch2/catch.hpp>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "train/fashion_mnist_runs.h"
#include "support/gpu_skip.h"
#include "support/test_util.h"

using namespace lockstep::testing;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kQuick = {"--train-samples", "512", "--test-samples", "500",
                                         "--epochs",        "1",   "--log-every",    "1"};

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

std::string gpu_present_reason() {
  return gpu_skip_reason().empty() ? "a GPU is present: cuda and auto mean a GPU here" : "";
}

double accuracy_of(const FashionMnistRun& run) {
  std::smatch m;
  const std::regex line("\ntest accuracy: ([0-9.]+)");
  REQUIRE(std::regex_search(run.result.output, m, line));
  return std::stod(m[1]);
}

}  // namespace

TEST_CASE("fashion_mnist --device cuda without a GPU fails at once, saying why",
          "[optim][device]") {
  SKIP_WITHOUT_FASHION_MNIST();
  LOCKSTEP_SKIP_IF(gpu_present_reason());
  for (int ranks : {1, 2}) {
    INFO(ranks << " rank(s)");
    const FashionMnistRun run = run_fashion_mnist(ranks, with(kQuick, {"--device", "cuda"}));
    INFO(run.result.output);
    CHECK(run.result.exit_code != 0);
    CHECK_FALSE(run.result.timed_out);
    CHECK_THAT(run.result.output, Contains("--device cuda: ") && Contains("or use --device cpu"));
    CHECK_THAT(run.result.output, !Contains("training and"));  // stopped before the data
  }
  const ProcessResult from_env =
      run_process(fashion_mnist_command(1, kQuick), std::chrono::seconds(60),
                  {"LOCKSTEP_DEVICE=cuda:0"});
  INFO(from_env.output);
  CHECK(from_env.exit_code != 0);
  CHECK_THAT(from_env.output, Contains("LOCKSTEP_DEVICE=cuda:0: "));
}

TEST_CASE("fashion_mnist --device auto without a GPU trains on the CPU exactly as --device cpu",
          "[optim][device]") {
  SKIP_WITHOUT_FASHION_MNIST();
  LOCKSTEP_SKIP_IF(gpu_present_reason());
  const FashionMnistRun automatic = run_fashion_mnist(2, kQuick);
  const FashionMnistRun cpu = run_fashion_mnist(2, with(kQuick, {"--device", "cpu"}));
  INFO(automatic.result.output << "\n" << cpu.result.output);
  REQUIRE(automatic.result.ok());
  REQUIRE(cpu.result.ok());
  CHECK_THAT(automatic.result.output, Contains("2 ranks (shm backend)"));
  CHECK(automatic.trained());
  CHECK(automatic.losses == cpu.losses);
  CHECK(automatic.digest == cpu.digest);
}

TEST_CASE("fashion_mnist on one GPU reaches the CPU's accuracy bar", "[optim][device][gpu]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  SKIP_WITHOUT_FASHION_MNIST();
  // The CPU's bar for this run: fashion_mnist_mlp_1_epoch (examples/CMakeLists.txt).
  const FashionMnistRun run =
      run_fashion_mnist(1, {"--model", "mlp", "--epochs", "1", "--log-every", "300"});
  INFO(run.result.output);
  REQUIRE(run.result.ok());
  CHECK_THAT(run.result.output, Contains("1 rank on cuda:0"));
  CHECK(accuracy_of(run) >= 0.80);
}

TEST_CASE("fashion_mnist: two ranks sharing one GPU train over staged shm to the same bar",
          "[optim][device][gpu]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  SKIP_WITHOUT_FASHION_MNIST();
  const std::vector<std::string> args = {"--model", "mlp", "--epochs", "1", "--batch-size", "32",
                                         "--log-every", "300", "--device", "cuda:0"};
  const FashionMnistRun run = run_fashion_mnist(2, args);
  INFO(run.result.output);
  REQUIRE(run.result.ok());
  CHECK_THAT(run.result.output, Contains("2 ranks on cuda:0, cuda:0 (shm backend)") &&
                                    Contains("ranks 0, 1 share cuda:0"));
  CHECK(accuracy_of(run) >= 0.80);
}

TEST_CASE("fashion_mnist: a checkpoint written on a GPU resumes on the CPU",
          "[optim][device][gpu]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  SKIP_WITHOUT_FASHION_MNIST();
  const std::string dir = fresh_checkpoint_dir("gpu-to-cpu");
  const std::vector<std::string> base = {"--train-samples", "2048", "--test-samples", "1000",
                                         "--optimizer", "adam", "--log-every", "1",
                                         "--checkpoint-dir", dir};
  const FashionMnistRun on_gpu =
      run_fashion_mnist(2, with(base, {"--epochs", "1", "--device", "cuda"}));
  INFO(on_gpu.result.output);
  REQUIRE(on_gpu.result.ok());
  const FashionMnistRun on_cpu =
      run_fashion_mnist(2, with(base, {"--epochs", "2", "--device", "cpu", "--resume"}));
  INFO(on_cpu.result.output);
  REQUIRE(on_cpu.result.ok());
  CHECK_THAT(on_cpu.result.output, Contains("resumed from") && Contains("2 ranks (shm backend)"));
  // Epoch 2 went on from the GPU's parameters: it starts near where epoch 1 ended.
  CHECK(on_cpu.losses.contains("epoch 2 step 1"));
  CHECK_FALSE(on_cpu.losses.contains("epoch 1 step 1"));
  CHECK(accuracy_of(on_cpu) >= 0.70);
  fs::remove_all(dir);
}
