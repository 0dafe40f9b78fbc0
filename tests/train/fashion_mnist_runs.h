// Helpers for the tests that run the fashion_mnist example through
// lockstep-run: skip where the dataset or the example is missing, build the
// command line, and read what a run printed (losses per step, the final
// parameters digest).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lockstep/models/fashion_mnist.h"
#include "support/skip.h"
#include "support/subprocess.h"

namespace lockstep::testing {

// Why this machine cannot run fashion_mnist, or empty.
inline std::string fashion_mnist_skip_reason() {
  namespace fs = std::filesystem;
  if (!fs::exists(fs::path(models::kFashionMnistDir) / "train-images-idx3-ubyte.gz"))
    return "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  if (!fs::exists(bin_path("fashion_mnist")))
    return "the fashion_mnist example is not built (LOCKSTEP_BUILD_EXAMPLES=OFF)";
  return {};
}

#define SKIP_WITHOUT_FASHION_MNIST() \
  LOCKSTEP_SKIP_IF(::lockstep::testing::fashion_mnist_skip_reason())

struct FashionMnistRun {
  ProcessResult result;
  std::string digest;                         // "parameters digest: <hex>"
  std::map<std::string, std::string> losses;  // "epoch 2 step 5" -> "0.512345"

  // Whether the run trained at all (any step logged; run it with --log-every 1).
  bool trained() const { return !losses.empty(); }
};

inline FashionMnistRun parse_fashion_mnist(ProcessResult r) {
  FashionMnistRun run{std::move(r), {}, {}};
  std::smatch m;
  const std::regex digest("parameters digest: ([0-9a-f]+)");
  if (std::regex_search(run.result.output, m, digest)) run.digest = m[1];
  const std::regex loss("(epoch \\d+ step \\d+)/\\d+ loss ([0-9.]+)");
  for (auto it = std::sregex_iterator(run.result.output.begin(), run.result.output.end(), loss);
       it != std::sregex_iterator(); ++it)
    run.losses[(*it)[1]] = (*it)[2];
  return run;
}

// fashion_mnist with `args`, through lockstep-run for more than one rank.
inline std::vector<std::string> fashion_mnist_command(int ranks,
                                                      const std::vector<std::string>& args) {
  std::vector<std::string> argv;
  if (ranks > 1) argv = {bin_path("lockstep-run"), "-np", std::to_string(ranks)};
  argv.push_back(bin_path("fashion_mnist"));
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

inline FashionMnistRun run_fashion_mnist(int ranks, const std::vector<std::string>& args) {
  return parse_fashion_mnist(
      run_process(fashion_mnist_command(ranks, args), std::chrono::seconds(300)));
}

// An empty scratch path (not created) for one test's checkpoints.
inline std::string fresh_checkpoint_dir(const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / fmt::format("lockstep-resume-{}-{}", name, ::getpid());
  fs::remove_all(dir);
  return dir.string();
}

}  // namespace lockstep::testing
