// Optimizer-state memory per rank and step time, with and without
// optim::ZeroRedundancyOptimizer, for a DDP training step with Adam. One
// process per rank:
//
//   lockstep-run -np 2 build/bin/zero_bench
//   lockstep-run -np 4 build/bin/zero_bench --model deep --json out.json
//   build/bin/zero_bench                           (world size 1)
//   benchmarks/zero_compare.py --build build       (1, 2 and 4 ranks, one table)
//
// Models: "mlp" is models::fashion_mlp (1.86 M parameters, one layer of
// 1024x1024 holding 56% of them: whole-parameter sharding cannot balance it,
// split parameters can); "deep" is --layers Linear(width, width) layers and a
// 10-way head, many equal layers, which both balance. Modes: plain Adam; ZeRO
// with split parameters (the default) and broadcast or all-gather sync; the
// same with whole parameters ("-whole", split_parameters = false). Each rank
// trains on its own
// synthetic batches (fixed seed). State bytes are the optimizer's state
// tensors after the warm-up (every rank's, by all-gather); step time is the
// slowest rank's mean of whole steps (zero_grad, forward, backward, step),
// "opt ms" the mean of optimizer.step() alone (rank 0; includes ZeRO's sync).
#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <numeric>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli_checks.h"
#include "common/device.h"
#include "common/writable_file.h"
#include "harness.h"
#include "lockstep/collectives/init.h"
#include "lockstep/models/models.h"
#include "lockstep/nn/activation.h"
#include "lockstep/nn/ddp/distributed_data_parallel.h"
#include "lockstep/nn/linear.h"
#include "lockstep/optim/adam.h"
#include "lockstep/optim/zero_redundancy_optimizer.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/random.h"
#include "lockstep/runtime/threads.h"

namespace {

using namespace lockstep;
using nlohmann::json;
using runtime::Tensor;

constexpr int kNumBatches = 4;

struct Options {
  std::vector<std::string> models{"mlp", "deep"};
  std::vector<std::string> modes{"plain", "zero-broadcast", "zero-allgather", "zero-broadcast-whole",
                                 "zero-allgather-whole"};
  int64_t batch = 32;
  int64_t width = 1024;
  int layers = 8;
  int warmup = 3;
  int iters = 10;
  std::string backend;
  uint64_t seed = 0;
  std::string json_file;
};

struct Result {
  std::string model, mode;
  int64_t params = 0;
  std::vector<int64_t> state_bytes;  // by rank
  double step_ms = 0, opt_ms = 0;

  int64_t total() const { return std::accumulate(state_bytes.begin(), state_bytes.end(), int64_t{0}); }
  int64_t most() const { return *std::max_element(state_bytes.begin(), state_bytes.end()); }
};

std::shared_ptr<nn::Module> make_model(const std::string& name, const Options& o, int64_t* in_features) {
  if (name == "mlp") {
    *in_features = 784;
    return models::fashion_mlp(o.seed);
  }
  runtime::Generator g(o.seed);
  auto m = std::make_shared<nn::Sequential>();
  for (int i = 0; i < o.layers; ++i) {
    m->push_back(std::make_shared<nn::Linear>(o.width, o.width, true, g));
    m->push_back(std::make_shared<nn::ReLU>());
  }
  m->push_back(std::make_shared<nn::Linear>(o.width, 10, true, g));
  *in_features = o.width;
  return m;
}

Result run_one(const std::string& name, const std::string& mode, const Options& o,
               const std::shared_ptr<collectives::ProcessGroup>& group) {
  int64_t in = 0;
  auto model = make_model(name, o, &in);
  auto ddp = std::make_shared<nn::DistributedDataParallel>(model, group);
  const optim::AdamOptions adam{.lr = 1e-3};
  std::unique_ptr<optim::Optimizer> plain;
  std::unique_ptr<optim::ZeroRedundancyOptimizer> zero;
  if (mode == "plain") {
    plain = std::make_unique<optim::Adam>(model->parameters(), adam);
  } else {
    optim::ZeroOptions zo;
    zo.sync = mode.starts_with("zero-allgather") ? optim::ZeroOptions::Sync::Allgather
                                                 : optim::ZeroOptions::Sync::Broadcast;
    zo.split_parameters = !mode.ends_with("-whole");
    zero = std::make_unique<optim::ZeroRedundancyOptimizer>(
        model->parameters(), group,
        [adam](std::vector<optim::ParamGroup> g) -> std::unique_ptr<optim::Optimizer> {
          return std::make_unique<optim::Adam>(std::move(g), adam);
        },
        zo);
  }
  optim::Optimizer& opt = zero ? static_cast<optim::Optimizer&>(*zero) : *plain;

  runtime::Generator g(o.seed * 1000 + static_cast<uint64_t>(group->rank()) + 1);
  std::vector<Tensor> xs, ys;
  for (int b = 0; b < kNumBatches; ++b) {
    xs.push_back(runtime::randn({o.batch, in}, runtime::DType::f32, g));
    std::vector<int64_t> labels(static_cast<size_t>(o.batch));
    for (auto& l : labels) l = g.next_u32() % 10;
    ys.push_back(Tensor::from_vector(labels, {o.batch}));
  }
  std::vector<double> steps, opts;
  auto step = [&](int i, bool timed) {
    const auto t0 = std::chrono::steady_clock::now();
    opt.zero_grad();
    runtime::cross_entropy(ddp->forward(xs[i % kNumBatches]), ys[i % kNumBatches]).backward();
    const auto t1 = std::chrono::steady_clock::now();
    opt.step();
    const auto t2 = std::chrono::steady_clock::now();
    if (!timed) return;
    steps.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
    opts.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
  };
  for (int i = 0; i < o.warmup; ++i) step(i, false);
  for (int i = 0; i < o.iters; ++i) step(o.warmup + i, true);

  Result r{name, mode};
  for (const auto& p : model->parameters()) r.params += p.numel();
  if (zero) {
    r.state_bytes = zero->all_state_bytes();
  } else {
    int64_t bytes = 0;
    for (const auto& [i, entries] : plain->state_dict().state)
      for (const auto& [k, v] : entries) bytes += v.numel() * static_cast<int64_t>(v.element_size());
    Tensor mine = Tensor::from_vector(std::vector<int64_t>{bytes}, {1});
    Tensor all = Tensor::zeros({group->size()}, runtime::DType::i64);
    group->allgather(all, mine)->wait();
    r.state_bytes = all.to_vector<int64_t>();
  }
  auto mean = [](const std::vector<double>& v) {
    return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  };
  r.opt_ms = mean(opts);
  r.step_ms = bench::max_over_ranks(*group, mean(steps));
  return r;
}

std::string mib(int64_t bytes) { return fmt::format("{:.2f}", static_cast<double>(bytes) / (1 << 20)); }

int run(const Options& o) {
  runtime::set_num_threads(1);
  auto group = collectives::init_process_group({.backend = o.backend});
  const int world = group->size();
  std::vector<Result> results;
  for (const auto& model : o.models)
    for (const auto& mode : o.modes) results.push_back(run_one(model, mode, o, group));
  group->barrier()->wait();
  if (group->rank() != 0) return 0;

  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  std::vector<std::vector<std::string>> rows;
  json jresults = json::array();
  std::vector<std::string> goal_lines;
  for (const auto& r : results) {
    // Plain Adam's whole state is what every rank holds without ZeRO.
    int64_t full = r.most();
    for (const auto& p : results)
      if (p.model == r.model && p.mode == "plain") full = p.most();
    const double ideal = static_cast<double>(full) / world;
    const double over = static_cast<double>(r.most()) / ideal;
    rows.push_back({r.model, std::to_string(world), group->backend(), r.mode,
                    fmt::format("{:.2f}M", static_cast<double>(r.params) / 1e6), mib(r.most()),
                    mib(r.state_bytes.front()), mib(r.total()), fmt::format("{:.2f}", over),
                    fmt::format("{:.2f}", r.step_ms), fmt::format("{:.2f}", r.opt_ms)});
    jresults.push_back({{"model", r.model}, {"mode", r.mode}, {"world_size", world},
                        {"backend", group->backend()}, {"params", r.params},
                        {"state_bytes_by_rank", r.state_bytes}, {"state_bytes_max", r.most()},
                        {"state_bytes_total", r.total()}, {"plain_state_bytes", full},
                        {"max_over_ideal", over}, {"step_ms", r.step_ms}, {"opt_step_ms", r.opt_ms},
                        {"batch", o.batch}, {"iters", o.iters}, {"warmup", o.warmup}});
    if (r.mode != "plain") {
      goal_lines.push_back(fmt::format(
          "# goal: ZeRO state per rank within 10% of 1/N of the total: {} {} N={} max rank "
          "{} MiB vs 1/N {} MiB ({:+.1f}%): {}",
          r.model, r.mode, world, mib(r.most()), mib(static_cast<int64_t>(ideal)),
          (over - 1) * 100, over <= 1.10 ? "PASS" : "FAIL"));
    }
  }
  json doc = {{"benchmark", "zero_bench"}, {"date", date}, {"machine", bench::machine_description()},
              {"world_size", world}, {"backend", group->backend()}, {"results", jresults}};
  fmt::print("# zero_bench {}: {} ranks, backend {}, Adam, batch {} per rank, {} warm-up + {} timed "
             "steps; step = slowest rank's mean; opt = rank 0's mean optimizer.step()\n# {}\n",
             date, world, group->backend(), o.batch, o.warmup, o.iters, bench::machine_description());
  fmt::print("{}", bench::format_table({"model", "ranks", "backend", "mode", "params",
                                        "state MiB max rank", "state MiB rank 0", "state MiB total",
                                        "max/ideal", "step ms", "opt ms"},
                                       rows));
  for (const auto& line : goal_lines) fmt::print("{}\n", line);
  bench::print_json(doc, o.json_file);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Optimizer-state memory per rank and step time with and without "
               "ZeroRedundancyOptimizer (Adam, DDP). Run one process per rank (lockstep-run -np N)."};
  app.add_option("--model", o.models, "mlp and/or deep")
      ->check(CLI::IsMember({"mlp", "deep"}))
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--mode", o.modes, "plain, zero-broadcast, zero-allgather (split parameters), "
                 "zero-broadcast-whole, zero-allgather-whole (whole parameters)")
      ->check(CLI::IsMember({"plain", "zero-broadcast", "zero-allgather", "zero-broadcast-whole",
                             "zero-allgather-whole"}))
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--batch", o.batch, "samples per rank per step")
      ->check(cli_checks::positive)->capture_default_str();
  app.add_option("--width", o.width, "deep: layer width")
      ->check(cli_checks::positive)->capture_default_str();
  app.add_option("--layers", o.layers, "deep: width x width layers")
      ->check(cli_checks::positive)->capture_default_str();
  app.add_option("--warmup", o.warmup)->check(cli_checks::non_negative)->capture_default_str();
  app.add_option("--iters", o.iters)->check(cli_checks::positive)->capture_default_str();
  app.add_option("--backend", o.backend, "shm, shm+gloo, gloo or mpi (default: LOCKSTEP_BACKEND, else shm on one node)")
      ->check(CLI::IsMember({"shm", "shm+gloo", "gloo", "mpi"}));
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--json", o.json_file, "write the results as JSON to this file (rank 0)")
      ->check(bench::writable_file);
  CLI11_PARSE(app, argc, argv);
  if (std::find(o.modes.begin(), o.modes.end(), "plain") == o.modes.end()) o.modes.insert(o.modes.begin(), "plain");
  try {
    return run(o);
  } catch (const std::exception& e) {
    fmt::print(stderr, "zero_bench: error: {}\n", e.what());
    return 1;
  }
}
