// Times one training step (forward + loss + backward + SGD with momentum) of
// the Fashion-MNIST MLP or CNN at one global batch, on the CPU, four ways in
// one run:
//
//   one process, 1 thread    the whole batch, one BLAS thread
//   one process, N threads   the whole batch, N BLAS threads
//   DataParallel             the batch split over N CPU replicas in one process
//   DDP                      N processes (collectives::spawn) of batch/N each, shm
//
//   build/bin/data_parallel_bench                       mlp and cnn, N = 2, table
//   build/bin/data_parallel_bench --replicas 2 --json   JSON
//
// Rounds alternate the four ways (so drift on a noisy machine hits all
// alike); each round's figure is the median step of `--steps` after
// `--warmup`, and the table gives the median over rounds. DDP's figure is
// rank 0's. samples/s = global batch / step time.
#include <ctime>
#include <filesystem>
#include <fstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include "cli_checks.h"
#include "common/bench_models.h"
#include "harness.h"
#include "lockstep/collectives/init.h"
#include "lockstep/collectives/spawn.h"
#include "lockstep/nn/data_parallel.h"
#include "lockstep/nn/ddp/distributed_data_parallel.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/random.h"
#include "lockstep/runtime/threads.h"

namespace lockstep {
namespace {

using nlohmann::json;
using runtime::Device;
using runtime::Tensor;

struct Options {
  std::vector<std::string> models{"mlp", "cnn"};
  int replicas = 2;
  int64_t batch = 64;
  int steps = 20;
  int warmup = 3;
  int rounds = 5;
  bool json_out = false;
};

// Median seconds per step of `model` run by `runner` on `rows` samples.
double step_seconds(nn::Module& model, nn::Module& runner, const std::string& name, int64_t rows,
                    const Options& o) {
  runtime::Generator g(1);
  const Tensor x = runtime::randn(bench::input_shape(name, rows), runtime::DType::f32, g);
  std::vector<int64_t> labels(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) labels[static_cast<size_t>(i)] = i % 10;
  const Tensor y = Tensor::from_vector(labels, {rows});
  optim::SGD sgd(model.parameters(), {.lr = 0.01, .momentum = 0.9});
  return bench::median_seconds(
      [&] {
        sgd.zero_grad();
        runtime::cross_entropy(runner.forward(x), y).backward();
        sgd.step();
      },
      o.warmup, o.steps);
}

double plain(const std::string& name, int threads, const Options& o) {
  runtime::set_num_threads(threads);
  runtime::Generator g(0);
  auto model = bench::make_model(name, g);
  const double s = step_seconds(*model, *model, name, o.batch, o);
  runtime::set_num_threads(1);
  return s;
}

double data_parallel(const std::string& name, const Options& o) {
  runtime::Generator g(0);
  auto model = bench::make_model(name, g);
  nn::DataParallel dp(model, std::vector<Device>(static_cast<size_t>(o.replicas), Device::cpu()));
  return step_seconds(*model, dp, name, o.batch, o);
}

double ddp(const std::string& name, const Options& o) {
  const auto file = std::filesystem::temp_directory_path() /
                    fmt::format("lockstep-data-parallel-bench-{}", ::getpid());
  collectives::spawn(o.replicas, [&](int rank) {
    auto group = collectives::init_process_group({.backend = "shm"});
    runtime::Generator g(0);
    auto model = bench::make_model(name, g);
    nn::DistributedDataParallel wrapped(model, group);
    const double s = step_seconds(*model, wrapped, name, o.batch / o.replicas, o);
    if (rank == 0) std::ofstream(file) << fmt::format("{:.9g}", s);
  });
  double s = 0;
  std::ifstream(file) >> s;
  std::filesystem::remove(file);
  return s;
}

int run(const Options& o) {
  LOCKSTEP_CHECK(o.batch % o.replicas == 0,
                 "--batch-size {} must split evenly over --replicas {} (DDP's ranks get batch / "
                 "replicas each)",
                 o.batch, o.replicas);
  runtime::set_num_threads(1);
  const std::vector<std::string> ways = {
      "one process, 1 thread", fmt::format("one process, {} threads", o.replicas),
      fmt::format("DataParallel, {} CPU replicas", o.replicas),
      fmt::format("DDP, {} processes", o.replicas)};
  json results = json::array();
  std::vector<std::vector<std::string>> rows;
  for (const auto& name : o.models) {
    std::vector<std::vector<double>> seconds(ways.size());
    for (int round = 0; round < o.rounds; ++round) {
      seconds[0].push_back(plain(name, 1, o));
      seconds[1].push_back(plain(name, o.replicas, o));
      seconds[2].push_back(data_parallel(name, o));
      seconds[3].push_back(ddp(name, o));
    }
    const double base = bench::median(seconds[0]);
    for (size_t w = 0; w < ways.size(); ++w) {
      const double s = bench::median(seconds[w]);
      const double per_s = static_cast<double>(o.batch) / s;
      rows.push_back({name, ways[w], fmt::format("{:.2f}", s * 1e3), fmt::format("{:.0f}", per_s),
                      fmt::format("{:.2f}x", base / s)});
      results.push_back({{"model", name}, {"way", ways[w]}, {"ms", s * 1e3},
                         {"samples_per_s", per_s}, {"speedup_vs_one_thread", base / s}});
    }
  }
  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  if (o.json_out) {
    bench::print_json({{"benchmark", "data_parallel_bench"}, {"date", date},
                       {"machine", bench::machine_description()}, {"batch", o.batch},
                       {"replicas", o.replicas}, {"steps", o.steps}, {"rounds", o.rounds},
                       {"results", results}},
                      "");
  } else {
    fmt::print("{}, global batch {}, median of {} rounds of {} steps\n",
               bench::machine_description(), o.batch, o.rounds, o.steps);
    fmt::print("{}", bench::format_table({"model", "how", "ms/step", "samples/s", "vs 1 thread"},
                                         rows));
  }
  return 0;
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  lockstep::Options o;
  CLI::App app{"Time a training step on one process, under DataParallel and under DDP."};
  app.add_option("--model", o.models, "mlp and/or cnn, e.g. mlp,cnn (default: both)")
      ->check(CLI::IsMember({"mlp", "cnn"}))
      ->delimiter(',');
  app.add_option("--replicas", o.replicas, "CPU replicas for DataParallel, ranks for DDP")
      ->check(CLI::Range(2, 64));
  app.add_option("--batch-size", o.batch, "global batch")->check(cli_checks::positive);
  app.add_option("--steps", o.steps, "timed steps per round")->check(cli_checks::positive);
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(cli_checks::non_negative);
  app.add_option("--rounds", o.rounds, "rounds alternating the four ways")
      ->check(cli_checks::positive);
  app.add_flag("--json", o.json_out, "print JSON instead of a table");
  CLI11_PARSE(app, argc, argv);
  try {
    return lockstep::run(o);
  } catch (const std::exception& e) {
    fmt::print(stderr, "data_parallel_bench: error: {}\n", e.what());
    return 1;
  }
}
