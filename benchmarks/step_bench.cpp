// Times one training step (forward + backward + SGD) of the Fashion-MNIST MLP
// and CNN at a fixed batch on a fixed number of threads, and runs PyTorch on
// the identical model in the same run when it is installed.
//
//   build/bin/step_bench              table
//   build/bin/step_bench --json       JSON
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <iostream>

#include <CLI/CLI.hpp>

#include "harness.h"
#include "lockstep/nn/models.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/threads.h"

#ifndef LOCKSTEP_SOURCE_DIR
#define LOCKSTEP_SOURCE_DIR "."
#endif

namespace {

using namespace lockstep;
using runtime::Tensor;
using nlohmann::json;

struct Options {
  std::vector<std::string> models{"mlp", "cnn"};
  int64_t batch_size = 64;
  int steps = 100;
  int warmup = 10;
  int threads = 1;
  bool json_out = false;
  bool peer = true;
  std::string python = "/usr/bin/python3";
  std::string peer_script = LOCKSTEP_SOURCE_DIR "/benchmarks/step_bench_torch.py";
};

double lockstep_step_ms(const std::string& name, const Options& o) {
  runtime::Generator g(0);
  auto model = name == "mlp" ? nn::models::fashion_mlp(g) : nn::models::fashion_cnn(g);
  optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  Tensor x = runtime::randn({o.batch_size, 1, 28, 28}, runtime::DType::f32, g);
  std::vector<int64_t> labels(o.batch_size);
  for (auto& l : labels) l = g.next_u32() % 10;
  Tensor y = Tensor::from_vector(labels, {o.batch_size});
  auto step = [&] {
    opt.zero_grad();
    Tensor loss = runtime::cross_entropy((*model)(x), y);
    loss.backward();
    opt.step();
  };
  return bench::median_seconds(step, o.warmup, o.steps) * 1e3;
}

// The peer's JSON, or a json object with "error" when it cannot run.
json peer_step(const std::string& name, const Options& o) {
  if (!std::filesystem::exists(o.python))
    return {{"error", o.python + " not found (apt-get install python3-torch)"}};
  if (!std::filesystem::exists(o.peer_script))
    return {{"error", "peer script " + o.peer_script + " not found (--peer-script)"}};
  auto probe = bench::run_command(o.python + " -c 'import torch' 2>/dev/null");
  if (probe.exit_code != 0) return {{"error", "PyTorch not installed (apt-get install python3-torch)"}};
  auto r = bench::run_command(fmt::format("{} {} --model {} --batch-size {} --steps {} --warmup {} "
                                          "--threads {}",
                                          o.python, o.peer_script, name, o.batch_size, o.steps,
                                          o.warmup, o.threads));
  json j = json::parse(r.output, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return {{"error", "peer printed no JSON (exit " + std::to_string(r.exit_code) + ")"}};
  if (r.exit_code == 3) j["error"] = "PyTorch is not on OpenBLAS: install libopenblas0";
  if (r.exit_code == 4) j["error"] = "PyTorch's OpenBLAS ignored the thread count";
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Time forward+backward+SGD of the Fashion-MNIST models, beside PyTorch."};
  app.add_option("--model", o.models, "mlp and/or cnn")->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--batch-size", o.batch_size)->check(CLI::PositiveNumber);
  app.add_option("--steps", o.steps, "timed steps (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--threads", o.threads, "threads for both lockstep and PyTorch")
      ->check(CLI::PositiveNumber);
  app.add_flag("--json", o.json_out, "print JSON instead of a table");
  app.add_flag("!--no-peer", o.peer, "skip PyTorch");
  app.add_option("--python", o.python, "Python with torch for the peer");
  app.add_option("--peer-script", o.peer_script);
  CLI11_PARSE(app, argc, argv);

  try {
    runtime::set_num_threads(o.threads);
    json results = json::array();
    std::vector<std::vector<std::string>> rows;
    for (const auto& name : o.models) {
      double ours = lockstep_step_ms(name, o);
      json row = {{"model", name}, {"batch_size", o.batch_size}, {"threads", o.threads},
                  {"lockstep_ms", ours}};
      std::string peer_cell = "-", ratio_cell = "-";
      if (o.peer) {
        json p = peer_step(name, o);
        row["pytorch"] = p;
        if (!p.contains("error")) {
          double theirs = p["median_ms"].get<double>();
          row["pytorch_ms"] = theirs;
          row["speedup_vs_pytorch"] = theirs / ours;
          peer_cell = fmt::format("{:.2f}", theirs);
          ratio_cell = fmt::format("{:.2f}x", theirs / ours);
        } else {
          peer_cell = "n/a";
          std::cerr << "step_bench: PyTorch peer for " << name << ": "
                    << p["error"].get<std::string>() << "\n";
        }
      }
      results.push_back(row);
      rows.push_back({name, std::to_string(o.batch_size), std::to_string(o.threads),
                      fmt::format("{:.2f}", ours), peer_cell, ratio_cell});
    }
    std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
    if (o.json_out) {
      json out = {{"benchmark", "step_bench"}, {"date", date},
                  {"machine", bench::machine_description()}, {"steps", o.steps},
                  {"warmup", o.warmup}, {"results", results}};
      std::cout << out.dump(2) << "\n";
    } else {
      fmt::print("step_bench {} on {} (median of {} steps after {} warm-up)\n", date,
                 bench::machine_description(), o.steps, o.warmup);
      fmt::print("{}", bench::format_table({"model", "batch", "threads", "lockstep ms/step",
                                            "PyTorch ms/step", "lockstep speedup"},
                                           rows));
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "step_bench: error: {}\n", e.what());
    return 1;
  }
}
