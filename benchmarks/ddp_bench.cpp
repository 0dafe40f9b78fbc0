// Times a data-parallel training step (forward + loss + backward + SGD step)
// of the Fashion-MNIST MLP or CNN, or ResNet-18 for 32x32 inputs, under
// nn::DistributedDataParallel: step time, samples/s, communication time and
// the share of it hidden behind backward, per bucket size. One process per rank:
//
//   lockstep-run -np 2 build/bin/ddp_bench --model cnn --bucket-cap-mb 1,5,25
//   mpirun -np 2 build/bin/ddp_bench --backend mpi --json out.json
//   build/bin/ddp_bench                      (world size 1: the one-rank baseline)
//   lockstep-run -np 1 build/bin/ddp_bench --device cuda --model resnet18 --compare-plain
//
// Each rank trains with SGD (lr 0.01, momentum 0.9) on its own synthetic
// batches (1x28x28 or 3x32x32, 10 classes), fixed seed. Steps run back to back
// with no barrier; the step time reported is the slowest rank's mean,
// samples/s = world size x batch / step time. Communication figures are the
// means of DistributedDataParallel::stats() over the timed steps (rank 0).
// benchmarks/ddp_compare.py runs this and PyTorch's DDP side by side.
//
// --device cuda: rank r trains on cuda:(local rank % GPUs), made current before
// the group is created; the default backend is then nccl. Each step ends with
// a device synchronize before the clock is read (kernels and NCCL run
// asynchronously). --compare-plain also times the same model without the DDP
// wrapper, one plain step before each DDP step (so drift in clocks or load
// hits both alike), and reports DDP's overhead over the plain step by median:
// at world size 1 the goal is within 3%. --kernel-trace N then traces
// N more plain and N more DDP steps (rank 0's GPU, common/kernel_profile.h)
// and shows where DDP's extra time goes: its extra kernels, copies and
// launches per step, and GPU busy time against the step's wall time.
// --verify-every K turns on DdpOptions::verify_every (the replicas' parameter
// hashes compared every K steps) and times one check on its own (median of
// 20): its cost per step is that over K, reported as a share of the step.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <numeric>
#include <optional>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli_checks.h"
#include "common/bench_models.h"
#include "common/device.h"
#include "common/kernel_profile.h"
#include "common/writable_file.h"
#include "harness.h"
#include "lockstep/collectives/init.h"
#include "lockstep/nn/ddp/distributed_data_parallel.h"
#include "lockstep/nn/ddp/replica_sync.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/distributed/device_select.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/threads.h"

namespace {

using namespace lockstep;
using nlohmann::json;
using runtime::Tensor;

constexpr int kNumBatches = 4;  // distinct batches per rank, used in turn
constexpr double kGoalOverheadPct = 3.0;  // DDP at world size 1 vs the plain step

struct Options {
  std::vector<std::string> models{"mlp"};
  int64_t batch = 0;  // 0: bench::default_batch(model)
  int warmup = 5;
  int iters = 30;
  std::vector<double> bucket_caps_mb{25.0};
  double first_bucket_cap_mb = 1.0;
  bool gradient_as_bucket_view = false;
  bool staged_buckets = false;  // DdpOptions::buckets_in_shared_memory = false
  int64_t verify_every = 0;     // DdpOptions::verify_every
  std::string backend;  // empty: LOCKSTEP_BACKEND, else the default (nccl on cuda)
  std::string device = "cpu";
  bool compare_plain = false;
  int kernel_trace = 0;  // CUDA: steps of each kind whose kernels are traced after the timing
  int threads = 1;
  uint64_t seed = 0;
  std::string json_file;
};

struct Result {
  std::string model;
  double cap_mb = 0;
  double step_ms = 0;        // slowest rank's mean
  double rank0_step_ms = 0;  // rank 0's mean
  double rank0_median_ms = 0;
  double forward_ms = 0, backward_ms = 0;  // rank 0's means
  // Per step, from the rank that finished backward last (see last_rank_figures).
  double comm_ms = 0, exposed_ms = 0;
  double hidden = 0;        // mean over steps of 1 - exposed / comm
  double imbalance_ms = 0;  // mean over steps: longest wait after backward minus the shortest
  double rank0_comm_ms = 0, rank0_exposed_ms = 0, rank0_hidden = 0;
  int64_t batch = 0;
  double ready_at_first_launch = 0;
  int64_t gradients_expected = 0;
  std::vector<int64_t> bucket_bytes;  // in launch order
  size_t shared_buckets = 0;          // in the group's shared pool
  // --compare-plain: rank 0's plain (no DDP) steps, and DDP's overhead over
  // them, (median DDP - median plain) / median plain.
  double plain_ms = 0, plain_median_ms = 0, overhead_pct = 0;
  // --verify-every: one check's median time, and its cost per step in % of one.
  double verify_ms = 0, verify_pct = 0;
  // --kernel-trace: rank 0's DDP steps' kernels beside the plain steps'.
  std::string kernel_table;
  json kernel_json;
};

double mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

/* Communication figures per step from the rank that finished backward last.
 *
 * A rank that finishes backward ahead of the others waits after it for
 * their gradients as well as for the communication; that extra wait is load
 * imbalance (noise in compute time), not communication. The rank that
 * finished last, which is the one that waited least, waits only for
 * communication still running. So per step, that rank's comm and exposed
 * times give the share hidden; imbalance is the longest wait minus the
 * shortest. `comm` and `exposed` are every rank's per-step values, rank
 * after rank (bench::gather_over_ranks). */
void last_rank_figures(const std::vector<double>& comm, const std::vector<double>& exposed,
                       int world, Result& r) {
  const size_t steps = exposed.size() / static_cast<size_t>(world);
  std::vector<double> last_comm, last_exposed, hidden, imbalance;
  for (size_t i = 0; i < steps; ++i) {
    size_t least = i, most = i;
    for (int q = 1; q < world; ++q) {
      const size_t k = static_cast<size_t>(q) * steps + i;
      if (exposed[k] < exposed[least]) least = k;
      if (exposed[k] > exposed[most]) most = k;
    }
    last_comm.push_back(comm[least]);
    last_exposed.push_back(exposed[least]);
    const double share = comm[least] > 0 ? 1.0 - exposed[least] / comm[least] : 0.0;
    hidden.push_back(std::clamp(share, 0.0, 1.0));
    imbalance.push_back(exposed[most] - exposed[least]);
  }
  r.comm_ms = mean(last_comm);
  r.exposed_ms = mean(last_exposed);
  r.hidden = mean(hidden);
  r.imbalance_ms = mean(imbalance);
}

std::shared_ptr<nn::Module> seeded_model(const std::string& name, const Options& o,
                                         const runtime::Device& device) {
  runtime::Generator gen(o.seed);
  auto model = bench::make_model(name, gen);
  model->to(device);  // no-op on the CPU
  return model;
}

Result run_one(const std::string& name, double cap_mb, const Options& o,
               const runtime::Device& device,
               const std::shared_ptr<collectives::ProcessGroup>& group) {
  const int rank = group->rank();
  const int64_t batch = o.batch > 0 ? o.batch : bench::default_batch(name);
  // The same initial model on every rank (DDP broadcasts rank 0's anyway).
  std::shared_ptr<nn::Module> model = seeded_model(name, o, device);
  nn::DdpOptions ddp_options;
  ddp_options.bucket_cap_mb = cap_mb;
  ddp_options.first_bucket_cap_mb = o.first_bucket_cap_mb;
  ddp_options.gradient_as_bucket_view = o.gradient_as_bucket_view;
  ddp_options.buckets_in_shared_memory = !o.staged_buckets;
  ddp_options.verify_every = o.verify_every;
  auto ddp = std::make_shared<nn::DistributedDataParallel>(model, group, ddp_options);
  optim::SGD opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});

  runtime::Generator g(o.seed * 1000 + static_cast<uint64_t>(rank) + 1);
  std::vector<Tensor> xs, ys;
  for (int b = 0; b < kNumBatches; ++b) {
    xs.push_back(runtime::randn(bench::input_shape(name, batch), runtime::DType::f32, g).to(device));
    std::vector<int64_t> labels(static_cast<size_t>(batch));
    for (auto& l : labels) l = g.next_u32() % 10;
    ys.push_back(Tensor::from_vector(labels, {batch}).to(device));
  }

  auto step = [&](int i) {
    opt.zero_grad();
    Tensor loss = runtime::cross_entropy(ddp->forward(xs[i % kNumBatches]), ys[i % kNumBatches]);
    loss.backward();
    opt.step();
    bench::synchronize(device);  // no-op on the CPU
  };

  // --compare-plain: the same model and batches, no DDP wrapper.
  std::shared_ptr<nn::Module> plain;
  std::optional<optim::SGD> plain_opt;
  if (o.compare_plain) {
    plain = seeded_model(name, o, device);
    plain_opt.emplace(plain->parameters(), optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
  }
  auto plain_step = [&](int i) {
    plain_opt->zero_grad();
    Tensor loss = runtime::cross_entropy((*plain)(xs[i % kNumBatches]), ys[i % kNumBatches]);
    loss.backward();
    plain_opt->step();
    bench::synchronize(device);
  };

  for (int i = 0; i < o.warmup; ++i) {
    if (plain) plain_step(i);
    step(i);
  }

  std::vector<double> times, plain_times, fwd, bwd, comm, exposed, hidden, ready;
  Result r;
  r.model = name;
  r.cap_mb = cap_mb;
  r.batch = batch;
  for (int i = 0; i < o.iters; ++i) {
    if (plain) {
      const auto p0 = std::chrono::steady_clock::now();
      plain_step(o.warmup + i);
      plain_times.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - p0).count());
    }
    const auto t0 = std::chrono::steady_clock::now();
    step(o.warmup + i);
    const auto t1 = std::chrono::steady_clock::now();
    times.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    const nn::DdpStats& s = ddp->stats();
    fwd.push_back(s.forward_ms);
    bwd.push_back(s.backward_ms);
    comm.push_back(s.comm_ms);
    exposed.push_back(s.exposed_comm_ms);
    hidden.push_back(s.hidden_fraction());
    ready.push_back(static_cast<double>(s.ready_at_first_launch));
    r.gradients_expected = s.gradients_expected;
    r.bucket_bytes = s.bucket_bytes;
  }
  for (const auto& b : ddp->buckets()) r.shared_buckets += b.in_shared_memory ? 1 : 0;

  r.rank0_step_ms = mean(times);
  r.rank0_median_ms = bench::median(times);
  r.forward_ms = mean(fwd);
  r.backward_ms = mean(bwd);
  r.rank0_comm_ms = mean(comm);
  r.rank0_exposed_ms = mean(exposed);
  r.rank0_hidden = mean(hidden);
  last_rank_figures(bench::gather_over_ranks(*group, comm, device),
                    bench::gather_over_ranks(*group, exposed, device), group->size(), r);
  r.ready_at_first_launch = mean(ready);
  if (plain) {
    r.plain_ms = mean(plain_times);
    r.plain_median_ms = bench::median(plain_times);
    r.overhead_pct = 100.0 * (r.rank0_median_ms - r.plain_median_ms) / r.plain_median_ms;
  }
  if (o.kernel_trace > 0) {
    int i = 0;  // the batches in turn, as in the timed steps
    std::optional<bench::ProfiledSide> plain_side;
    if (plain) {
      plain_side = bench::ProfiledSide{
          "plain", bench::trace_steps(device, o.kernel_trace, [&] { plain_step(i++); }),
          r.plain_median_ms};
    }
    const bench::ProfiledSide ddp_side{
        "DDP", bench::trace_steps(device, o.kernel_trace, [&] { step(i++); }), r.rank0_median_ms};
    r.kernel_table = bench::compare_profiles(
        fmt::format("where the GPU time goes, rank 0: {} DDP, batch {}", name, batch), ddp_side,
        plain_side);
    r.kernel_json = {{"ddp", ddp_side.profile.to_json()}};
    if (plain_side) r.kernel_json["plain"] = plain_side->profile.to_json();
  }
  // The slowest rank's mean step time (after the loop: no barrier inside it).
  r.step_ms = bench::max_over_ranks(*group, r.rank0_step_ms, device);
  if (o.verify_every > 0) {
    std::vector<double> checks;
    for (int i = 0; i < 20; ++i) {
      const auto c0 = std::chrono::steady_clock::now();
      nn::verify_replicas_identical(model->named_parameters(), *group, "in ddp_bench");
      checks.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0).count());
    }
    r.verify_ms = bench::max_over_ranks(*group, bench::median(checks), device);
    r.verify_pct = 100.0 * r.verify_ms / static_cast<double>(o.verify_every) / r.step_ms;
  }
  return r;
}

std::string bytes_list(const std::vector<int64_t>& bytes) {
  std::string s;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (i) s += ",";
    const double b = static_cast<double>(bytes[i]);
    s += b >= 1 << 20 ? fmt::format("{:.1f}M", b / (1 << 20)) : fmt::format("{:.0f}K", b / (1 << 10));
  }
  return s;
}

int run(const Options& o) {
  runtime::set_num_threads(o.threads);
  // The rank's GPU must be current before the group exists: NCCL's
  // communicator and the staging buffers live on the current device. The
  // default backend follows the device (nccl with a GPU per rank).
  const runtime::Device device = distributed::select_device({.request = o.device});
  bench::check_kernel_trace(o.kernel_trace, device);
  auto group = collectives::init_process_group({.backend = o.backend});
  const int rank = group->rank();
  const int world = group->size();

  std::vector<Result> results;
  for (const auto& name : o.models)
    for (double cap : o.bucket_caps_mb) results.push_back(run_one(name, cap, o, device, group));
  group->barrier()->wait();
  if (rank != 0) return 0;

  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  const std::string device_str = device.is_cuda() ? fmt::format("cuda:{}", device.index) : "cpu";
  const std::string machine = bench::machine_description(device);
  std::vector<std::vector<std::string>> rows;
  json jresults = json::array();
  for (const auto& r : results) {
    const double sps = static_cast<double>(world * r.batch) / (r.step_ms / 1e3);
    std::vector<std::string> row{
        r.model, device_str, std::to_string(world), group->backend(), std::to_string(r.batch),
        fmt::format("{:g}", r.cap_mb), std::to_string(r.bucket_bytes.size()),
        fmt::format("{:.2f}", r.step_ms), fmt::format("{:.0f}", sps),
        fmt::format("{:.2f}", r.forward_ms), fmt::format("{:.2f}", r.backward_ms),
        fmt::format("{:.2f}", r.comm_ms), fmt::format("{:.2f}", r.exposed_ms),
        fmt::format("{:.0f}", r.hidden * 100), fmt::format("{:.2f}", r.imbalance_ms)};
    if (o.compare_plain) {
      row.push_back(fmt::format("{:.2f}", r.plain_median_ms));
      row.push_back(fmt::format("{:.2f}", r.rank0_median_ms));
      row.push_back(fmt::format("{:+.1f}", r.overhead_pct));
    }
    rows.push_back(row);
    jresults.push_back({{"impl", "lockstep"}, {"model", r.model}, {"device", device_str},
                        {"world_size", world}, {"backend", group->backend()}, {"batch", r.batch},
                        {"bucket_cap_mb", r.cap_mb}, {"first_bucket_cap_mb", o.first_bucket_cap_mb},
                        {"gradient_as_bucket_view", o.gradient_as_bucket_view},
                        {"verify_every", o.verify_every},
                        {"verify_ms", r.verify_ms}, {"verify_pct_of_step", r.verify_pct},
                        {"iters", o.iters}, {"warmup", o.warmup}, {"step_ms", r.step_ms},
                        {"rank0_step_ms", r.rank0_step_ms},
                        {"rank0_median_step_ms", r.rank0_median_ms}, {"samples_per_s", sps},
                        {"forward_ms", r.forward_ms}, {"backward_ms", r.backward_ms},
                        {"comm_ms", r.comm_ms}, {"exposed_comm_ms", r.exposed_ms},
                        {"hidden_fraction", r.hidden}, {"imbalance_ms", r.imbalance_ms},
                        {"rank0_comm_ms", r.rank0_comm_ms},
                        {"rank0_exposed_comm_ms", r.rank0_exposed_ms},
                        {"rank0_hidden_fraction", r.rank0_hidden},
                        {"ready_at_first_launch", r.ready_at_first_launch},
                        {"gradients_expected", r.gradients_expected},
                        {"buckets", r.bucket_bytes.size()}, {"bucket_bytes", r.bucket_bytes},
                        {"buckets_in_shared_memory", r.shared_buckets}});
    if (!r.kernel_json.is_null()) jresults.back()["kernel_profile"] = r.kernel_json;
    if (o.compare_plain) {
      json& j = jresults.back();
      j["plain_step_ms"] = r.plain_ms;
      j["plain_median_step_ms"] = r.plain_median_ms;
      j["ddp_overhead_pct"] = r.overhead_pct;
      if (world == 1 && device.is_cuda()) {  // the GPU issue's goal
        j["goal_overhead_pct"] = kGoalOverheadPct;
        j["goal_met"] = r.overhead_pct <= kGoalOverheadPct;
      }
    }
  }
  json doc = {{"benchmark", "ddp_bench"}, {"date", date}, {"machine", machine},
              {"device", device_str}, {"world_size", world}, {"backend", group->backend()},
              {"threads", o.threads}, {"peer_env", bench::peer_env()},
              {"openblas_core", runtime::cpu::blas_core().name}, {"results", jresults}};
  if (device.is_cuda()) doc["gpu"] = bench::device_name(device);
  fmt::print("# ddp_bench {}: {} ranks, backend {}, {} warm-up + {} timed steps; "
             "step = slowest rank's mean; fwd/bwd = rank 0's means; comm/exposed/hidden = "
             "per step, the rank that finished backward last; imbalance = per step, the longest "
             "wait after backward minus the shortest{}\n# {}\n",
             date, world, group->backend(), o.warmup, o.iters,
             o.verify_every > 0 ? fmt::format("; replicas verified every {} steps", o.verify_every)
                                : "",
             machine);
  std::vector<std::string> header{"model", "device", "ranks", "backend", "batch", "bucket cap MiB",
                                  "buckets", "step ms", "samples/s", "fwd ms", "bwd ms",
                                  "comm ms", "exposed ms", "hidden %", "imbalance ms"};
  if (o.compare_plain)
    header.insert(header.end(), {"plain median ms", "DDP median ms", "DDP overhead %"});
  fmt::print("{}", bench::format_table(header, rows));
  if (o.compare_plain && world == 1 && device.is_cuda()) {
    for (const auto& r : results)
      fmt::print("# goal: {} DDP at world size 1 over {} within {:g}% of the plain step: {:+.1f}% "
                 "({})\n",
                 r.model, group->backend(), kGoalOverheadPct, r.overhead_pct,
                 r.overhead_pct <= kGoalOverheadPct ? "met" : "NOT met");
  }
  for (const auto& r : results)
    fmt::print("# {} cap {:g} MiB: bucket bytes in launch order {}; {:.1f} of {} gradients ready "
               "at the first launch; {} of {} buckets in shared memory\n",
               r.model, r.cap_mb, bytes_list(r.bucket_bytes), r.ready_at_first_launch,
               r.gradients_expected, r.shared_buckets, r.bucket_bytes.size());
  if (o.verify_every > 0) {
    for (const auto& r : results)
      fmt::print("# {}: one replica check takes {:.3f} ms; every {} steps that is {:.3f}% of a "
                 "{:.2f} ms step (goal: under 1%)\n",
                 r.model, r.verify_ms, o.verify_every, r.verify_pct, r.step_ms);
  }
  for (const auto& r : results) {
    if (!r.kernel_table.empty()) fmt::print("\n{}", r.kernel_table);
  }
  bench::print_json(doc, o.json_file);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Time a DistributedDataParallel training step of the Fashion-MNIST models. Run "
               "one process per rank (lockstep-run -np N, mpirun -np N)."};
  app.add_option("--model", o.models, "mlp, cnn and/or resnet18")
      ->check(CLI::IsMember(bench::model_names()))
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--batch", o.batch,
                 "samples per rank per step (default: 64 for mlp and cnn, 256 for resnet18)")
      ->check(cli_checks::positive);
  app.add_option("--warmup", o.warmup, "untimed steps first")
      ->check(cli_checks::non_negative)
      ->capture_default_str();
  app.add_option("--iters", o.iters, "timed steps")
      ->check(cli_checks::positive)->capture_default_str();
  app.add_option("--bucket-cap-mb", o.bucket_caps_mb, "bucket cap(s) in MiB; a list sweeps, e.g. 1,5,25")
      ->delimiter(',')
      ->check(cli_checks::positive)
      ->capture_default_str();
  app.add_option("--first-bucket-cap-mb", o.first_bucket_cap_mb)
      ->check(cli_checks::positive)
      ->capture_default_str();
  app.add_flag("--gradient-as-bucket-view", o.gradient_as_bucket_view);
  app.add_option("--verify-every", o.verify_every,
                 "compare the replicas' parameters every K steps (DdpOptions::verify_every; 0: never)")
      ->check(cli_checks::non_negative)
      ->capture_default_str();
  app.add_flag("--staged-buckets", o.staged_buckets,
               "buckets in ordinary memory, staged by the all-reduce (default over shm: in the "
               "group's shared pool, read in place)");
  app.add_option("--backend", o.backend,
                 "nccl, shm, shm+gloo, gloo or mpi (default: LOCKSTEP_BACKEND, else what "
                 "init_process_group picks: nccl with a GPU per rank, shm on one node)")
      ->check(CLI::IsMember({"nccl", "shm", "shm+gloo", "gloo", "mpi"}));
  app.add_option("--device", o.device, "cpu, or cuda: each rank on cuda:(local rank % GPUs)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_flag("--compare-plain", o.compare_plain,
               "also time the model without DDP (rank 0) and report DDP's overhead");
  app.add_option("--kernel-trace", o.kernel_trace,
                 "CUDA: trace this many more DDP (and, with --compare-plain, plain) steps' "
                 "kernels and show where the GPU time goes")
      ->check(cli_checks::non_negative);
  app.add_option("--threads", o.threads, "BLAS threads per rank")
      ->check(cli_checks::positive)
      ->capture_default_str();
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--json", o.json_file, "write the results as JSON to this file (rank 0) instead "
                                        "of printing them after the table")
      ->check(bench::writable_file);
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    fmt::print(stderr, "ddp_bench: error: {}\n", e.what());
    return 1;
  }
}
