// Times one training step (forward + backward + SGD with momentum) of the
// Fashion-MNIST MLP and CNN, a ResNet-18 for 32x32 inputs, or a GPT, at a
// fixed batch, on the CPU (a fixed number of threads) or one GPU, and runs
// PyTorch on the identical model in the same run when it is installed.
//
//   build/bin/step_bench                                   CPU, mlp and cnn, table
//   build/bin/step_bench --json                            JSON
//   build/bin/step_bench --device cuda --model mlp,cnn,resnet18 --python python3
//   build/bin/step_bench --model gpt --batch-size 8 --seq-len 128
//
// The GPT (bench::gpt_config) is, on the CPU, a small byte-level one: vocab
// 256, block 128, 4 layers, 4 heads, n_embd 128 (842,496 parameters), about
// 6 GFLOP a step at batch 8 x 128 tokens, so tens of milliseconds at one
// thread; on CUDA it is GPT-2 124M at batch 8 x 1024 tokens. Its tokens are
// random ids from a seeded generator, each sequence's targets the same ids
// shifted by one; the loss is forward_values' mean cross-entropy, the
// optimizer the same SGD with momentum. Its rows add tokens/s (batch x
// sequence / step time), and the parameter counts of both sides are compared
// (a mismatch is reported as the peer's error). PyTorch's twin is nanoGPT's
// module tree, with scaled_dot_product_attention where torch has it (2.x) and
// attention written out otherwise.
//
// On CUDA each timed step ends with a device synchronize (kernels run
// asynchronously: without it the clock would stop after the launches), the
// warm-up steps also let cuDNN pick its algorithms, and the table shows the
// issue's goals: >= 2x PyTorch eager's samples/s for the MLP and CNN at batch
// 64, >= 1.0x for ResNet-18 at batch 256. TF32 is off on both sides unless
// --tf32 (PyTorch's cuDNN would otherwise use it by default). Both sides time
// cuDNN's convolution engines at each new shape and keep the fastest
// (cuDNN benchmark mode: runtime/cuda/ops/math_mode.h, cudnn.benchmark)
// unless --cudnn-benchmark off, which takes cuDNN's heuristics on both.
//
// The GPT's row also gives lockstep's peak memory over one step: on the CPU
// the host cache's (runtime/cpu/host_cache.h), on a GPU the caching
// allocator's. --checkpoint checkpoints every GPT block
// (GptConfig::checkpoint_blocks; the PyTorch peer does not): run with and
// without it to compare the peaks and step times.
//
// --kernel-trace N (CUDA) then traces N more steps of each side's kernels
// (lockstep's trace_activity and torch.profiler, both CUPTI) and prints where
// the GPU time goes: microseconds per step by kind of work (conv, gemm, norm,
// elementwise, ...), the GPU's busy time against the step's wall time, the
// launches per step, and each side's top kernels (common/kernel_profile.h).
//
// --amp bf16|f16 runs each forward and loss under autocast at that dtype on
// both sides (runtime/autocast.h; torch.autocast), f32 master weights, f16
// with a GradScaler (PyTorch's on CUDA; its CPU autocast has no f16, so the
// CPU peer runs bf16 only). On the CPU lockstep's bf16 and f16 compute in f32
// and round on store: correct, not fast.
#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_checks.h"
#include "common/bench_models.h"
#include "common/device.h"
#include "common/kernel_profile.h"
#include "harness.h"
#include "lockstep/models/models.h"
#include "lockstep/optim/grad_scaler.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/cpu/host_cache.h"
#include "lockstep/runtime/device_backend.h"
#include "lockstep/distributed/device_select.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/threads.h"

#ifndef LOCKSTEP_SOURCE_DIR
#define LOCKSTEP_SOURCE_DIR "."
#endif

namespace {

using namespace lockstep;
using runtime::Device;
using runtime::Tensor;
using nlohmann::json;

struct Options {
  std::vector<std::string> models{"mlp", "cnn"};
  int64_t batch_size = 0;  // 0: bench::default_batch(model)
  int64_t seq_len = 0;     // gpt only; 0: the config's block_size
  int steps = 100;
  int warmup = 10;
  int threads = 1;
  std::string device = "cpu";
  bool tf32 = false;
  std::string cudnn_benchmark = "on";  // CUDA, both sides: time cuDNN's engines per shape
  bool checkpoint = false;  // gpt only: checkpoint every block
  std::string amp = "none";  // none, bf16, f16: autocast's dtype
  int kernel_trace = 0;      // CUDA: steps whose kernels are traced after the timing
  bool json_out = false;
  bool peer = true;
  std::string python = "/usr/bin/python3";
  std::string peer_script = LOCKSTEP_SOURCE_DIR "/benchmarks/step_bench_torch.py";
};

int64_t batch_for(const std::string& name, const Options& o) {
  return o.batch_size > 0 ? o.batch_size : bench::default_batch(name);
}

// The GPU goal for this row (lockstep's samples/s over PyTorch's), or
// none where no goal was set: on the CPU, or at another batch.
std::optional<double> goal_speedup(const std::string& name, int64_t batch, const Device& device) {
  if (!device.is_cuda()) return std::nullopt;
  if ((name == "mlp" || name == "cnn") && batch == 64) return 2.0;
  if (name == "resnet18" && batch == 256) return 1.0;
  return std::nullopt;
}

// The step benchmark's models: bench::model_names() and the GPT.
std::vector<std::string> step_model_names() {
  std::vector<std::string> names = bench::model_names();
  names.push_back("gpt");
  return names;
}

// One optimizer step: zero_grad, `loss` under autocast at --amp, backward
// (through a GradScaler for f16), step.
class AmpStep {
 public:
  explicit AmpStep(const Options& o)
      : amp_(o.amp), scaler_({.enabled = o.amp == "f16"}) {}
  void operator()(optim::Optimizer& opt, const std::function<Tensor()>& loss_of) {
    opt.zero_grad();
    Tensor loss;
    {
      auto scope = runtime::autocast({.dtype = amp_ == "f16" ? runtime::DType::f16
                                                             : runtime::DType::bf16,
                                      .enabled = amp_ != "none"});
      loss = loss_of();
    }
    scaler_.scale(loss).backward();
    scaler_.step(opt);
    scaler_.update();
  }

 private:
  std::string amp_;
  optim::GradScaler scaler_;
};

// One side's step: its median time, and for the GPT its size and peak memory.
struct StepResult {
  double ms = 0;
  int64_t parameters = 0;  // gpt: the tied wte / lm_head weight once, as PyTorch counts
  size_t peak_bytes = 0;   // gpt: memory in use at the peak of one step (host or device)
  std::optional<bench::KernelProfile> kernels;  // --kernel-trace
};

StepResult lockstep_step(const std::string& name, int64_t batch, const Device& device,
                         const Options& o) {
  runtime::Generator g(0);
  auto model = bench::make_model(name, g);
  Tensor x = runtime::randn(bench::input_shape(name, batch), runtime::DType::f32, g);
  std::vector<int64_t> labels(static_cast<size_t>(batch));
  for (auto& l : labels) l = g.next_u32() % 10;
  Tensor y = Tensor::from_vector(labels, {batch});
  if (device.is_cuda()) {
    model->to(device);
    x = x.to(device);
    y = y.to(device);
  }
  optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  AmpStep amp_step(o);
  auto step = [&] {
    amp_step(opt, [&] { return runtime::cross_entropy((*model)(x), y); });
    bench::synchronize(device);  // no-op on the CPU
  };
  StepResult r{.ms = bench::median_seconds(step, o.warmup, o.steps) * 1e3};
  if (o.kernel_trace > 0) r.kernels = bench::trace_steps(device, o.kernel_trace, step);
  return r;
}

// The GPT as configured, its blocks checkpointed under --checkpoint.
models::GptConfig gpt_config_for(const Device& device, const Options& o) {
  models::GptConfig c = bench::gpt_config(device);
  c.checkpoint_blocks = o.checkpoint;
  return c;
}

// The most memory in use on `device` during one more run of `step`.
size_t peak_bytes(const Device& device, const std::function<void()>& step) {
  if (device.is_cpu()) {
    runtime::cpu::reset_host_peak();
    step();
    return runtime::cpu::host_cache_stats().peak_bytes;
  }
  const runtime::DeviceBackend& backend = runtime::device_backend(device);
  backend.reset_peak_memory(device);
  step();
  return backend.peak_allocated_bytes(device);
}

// The GPT's step on `batch` sequences of `seq_len` random token ids.
StepResult lockstep_gpt_step(const models::GptConfig& config, int64_t batch, int64_t seq_len,
                          const Device& device, const Options& o) {
  runtime::Generator g(0);
  auto model = models::gpt(config, g);
  StepResult r;
  for (const auto& p : model->parameters()) r.parameters += p.numel();
  // Each row is seq_len + 1 ids: the first seq_len the input, the last seq_len its targets.
  std::vector<int64_t> ids(static_cast<size_t>(batch * seq_len)), targets(ids.size());
  for (int64_t b = 0; b < batch; ++b) {
    int64_t previous = g.next_u32() % config.vocab_size;
    for (int64_t t = 0; t < seq_len; ++t) {
      const auto i = static_cast<size_t>(b * seq_len + t);
      ids[i] = previous;
      targets[i] = previous = g.next_u32() % config.vocab_size;
    }
  }
  Tensor idx = Tensor::from_vector(ids, {batch, seq_len});
  Tensor y = Tensor::from_vector(targets, {batch, seq_len});
  if (device.is_cuda()) {
    model->to(device);
    idx = idx.to(device);
    y = y.to(device);
  }
  optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  AmpStep amp_step(o);
  auto step = [&] {
    amp_step(opt, [&] { return model->forward_values({idx, y}).tensor(1); });
    bench::synchronize(device);  // no-op on the CPU
  };
  r.ms = bench::median_seconds(step, o.warmup, o.steps) * 1e3;
  r.peak_bytes = peak_bytes(device, step);
  if (o.kernel_trace > 0) r.kernels = bench::trace_steps(device, o.kernel_trace, step);
  return r;
}

// " --seq-len 128 --vocab-size 256 ...": the GPT's shape for the peer.
std::string gpt_peer_args(const models::GptConfig& c, int64_t seq_len) {
  return fmt::format(" --seq-len {} --vocab-size {} --block-size {} --n-layer {} --n-head {} "
                     "--n-embd {}",
                     seq_len, c.vocab_size, c.block_size, c.n_layer, c.n_head, c.n_embd);
}

// The peer's JSON, or a json object with "error" when it cannot run.
// `extra_args` are appended to its command line (the GPT's shape; empty otherwise).
json peer_step(const std::string& name, int64_t batch, const std::string& extra_args,
               const Device& device, const Options& o) {
  if (!bench::program_exists(o.python))
    return {{"error", o.python + " not found (apt-get install python3-torch, or --python)"}};
  if (!std::filesystem::exists(o.peer_script))
    return {{"error", "peer script " + o.peer_script + " not found (--peer-script)"}};
  auto probe = bench::run_command(o.python + " -c 'import torch' 2>/dev/null");
  if (probe.exit_code != 0) return {{"error", "PyTorch not installed (apt-get install python3-torch)"}};
  if (o.amp == "f16" && !device.is_cuda())
    return {{"error", "PyTorch's CPU autocast has no f16"}};
  if (device.is_cuda()) {
    probe = bench::run_command(o.python + " -c 'import sys, torch; "
                                          "sys.exit(0 if torch.cuda.is_available() else 1)' "
                                          "2>/dev/null");
    if (probe.exit_code != 0)
      return {{"error", "PyTorch at " + o.python + " has no usable CUDA "
                        "(torch.cuda.is_available() is false); pass --python with a CUDA build"}};
  }
  auto r = bench::run_command(fmt::format("{}{} {} --model {} --batch-size {} --steps {} --warmup {} "
                                          "--threads {} --device {} --amp {}{}{}{}{}",
                                          bench::peer_env_prefix(), o.python, o.peer_script,
                                          name, batch, o.steps, o.warmup,
                                          o.threads, device.is_cuda() ? "cuda" : "cpu", o.amp,
                                          o.tf32 ? " --tf32" : "",
                                          device.is_cuda() && o.cudnn_benchmark == "off"
                                              ? " --cudnn-benchmark off"
                                              : "",
                                          extra_args,
                                          o.kernel_trace > 0
                                              ? fmt::format(" --kernel-trace {}", o.kernel_trace)
                                              : ""));
  json j = json::parse(r.output, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return {{"error", "peer printed no JSON (exit " + std::to_string(r.exit_code) + ")"}};
  if (r.exit_code == 3) j["error"] = "PyTorch is not on OpenBLAS: install libopenblas0";
  if (r.exit_code == 4) j["error"] = "PyTorch's OpenBLAS ignored the thread count";
  if (r.exit_code != 0 && !j.contains("error"))
    j["error"] = "peer exited with " + std::to_string(r.exit_code);
  // Both on one OpenBLAS: a comparison of two kernel sets would time OpenBLAS.
  const std::string ours = runtime::cpu::blas_core().name;
  if (!j.contains("error") && j.contains("openblas_core") && j["openblas_core"].is_string() &&
      j["openblas_core"].get<std::string>() != ours)
    j["error"] = fmt::format("PyTorch's OpenBLAS ran its {} kernels, lockstep its {}",
                             j["openblas_core"].get<std::string>(), ours);
  return j;
}

int run(const Options& o) {
  runtime::set_num_threads(o.threads);
  LOCKSTEP_CHECK(!o.tf32 || o.device == "cuda", "--tf32 needs --device cuda");
  const Device device = distributed::select_device({.request = o.device});
  bench::check_kernel_trace(o.kernel_trace, device);
  bench::set_allow_tf32(o.tf32);
  if (device.is_cuda()) bench::set_cudnn_benchmark(o.cudnn_benchmark == "on");
  const std::string machine = bench::machine_description(device);
  const std::string device_str = device.is_cuda() ? fmt::format("cuda:{}", device.index) : "cpu";
  // The GPT's rows add tokens/s columns and a line under the table; without
  // it the output is what it was before the GPT existed.
  const bool has_gpt = std::find(o.models.begin(), o.models.end(), "gpt") != o.models.end();
  const models::GptConfig gpt = gpt_config_for(device, o);
  LOCKSTEP_CHECK(!o.checkpoint || has_gpt, "--checkpoint is for --model gpt only");
  const int64_t seq_len = o.seq_len > 0 ? o.seq_len : gpt.block_size;
  LOCKSTEP_CHECK(o.seq_len == 0 || has_gpt, "--seq-len is for --model gpt only");
  LOCKSTEP_CHECK(seq_len <= gpt.block_size, "--seq-len {} exceeds the gpt's block_size {}",
                 seq_len, gpt.block_size);
  std::string gpt_note;
  std::string profiles;  // --kernel-trace: one comparison per model

  json results = json::array();
  std::vector<std::vector<std::string>> rows;
  for (const auto& name : o.models) {
    const int64_t batch = batch_for(name, o);
    const bool is_gpt = name == "gpt";
    const StepResult step = is_gpt ? lockstep_gpt_step(gpt, batch, seq_len, device, o)
                                   : lockstep_step(name, batch, device, o);
    const double ours = step.ms;
    const auto tokens_per_s = [&](double ms) {
      return static_cast<double>(batch * seq_len) / (ms / 1e3);
    };
    const auto goal = goal_speedup(name, batch, device);
    json row = {{"model", name}, {"device", device_str}, {"batch_size", batch},
                {"threads", o.threads}, {"lockstep_ms", ours},
                {"lockstep_samples_per_s", static_cast<double>(batch) / (ours / 1e3)}};
    std::string peer_cell = "-", ratio_cell = "-", goal_cell = "-";
    std::string tokens_cell = "-", peer_tokens_cell = "-", peer_parameters = "n/a";
    std::string peak_cell = "-";
    if (is_gpt) {
      row["seq_len"] = seq_len;
      row["gpt_config"] = {{"vocab_size", gpt.vocab_size}, {"block_size", gpt.block_size},
                           {"n_layer", gpt.n_layer},       {"n_head", gpt.n_head},
                           {"n_embd", gpt.n_embd},         {"dropout", gpt.dropout},
                           {"checkpoint_blocks", gpt.checkpoint_blocks}};
      row["parameters"] = step.parameters;
      row["peak_bytes"] = step.peak_bytes;
      peak_cell = fmt::format("{:.1f}", static_cast<double>(step.peak_bytes) / (1 << 20));
      row["lockstep_tokens_per_s"] = tokens_per_s(ours);
      tokens_cell = fmt::format("{:.0f}", tokens_per_s(ours));
    }
    if (goal) {
      row["goal_speedup"] = *goal;
      goal_cell = fmt::format(">= {:.1f}x", *goal);
    }
    std::optional<bench::KernelProfile> peer_kernels;  // --kernel-trace, from the peer
    std::optional<double> peer_ms;
    if (o.peer) {
      json p = peer_step(name, batch, is_gpt ? gpt_peer_args(gpt, seq_len) : "", device, o);
      if (is_gpt && p.contains("parameters")) {
        const auto theirs = p["parameters"].get<int64_t>();
        peer_parameters = std::to_string(theirs);
        if (theirs != step.parameters && !p.contains("error"))
          p["error"] = fmt::format("PyTorch's GPT has {} parameters, lockstep's {}: not the same "
                                   "model",
                                   theirs, step.parameters);
      }
      if (p.contains("kernel_trace")) {  // raw activities: summarized here, not kept
        const json& t = p["kernel_trace"];
        if (t.contains("error")) {
          profiles += fmt::format("\nPyTorch's kernel trace of {} failed: {}\n", name,
                                  t["error"].dump());
        } else {
          peer_kernels = bench::summarize_activities(
              bench::activities_from_json(t.value("activities", json::array())),
              t.value("steps", 0));
        }
        p.erase("kernel_trace");
      }
      if (p.contains("median_ms")) peer_ms = p["median_ms"].get<double>();
      row["pytorch"] = p;
      if (!p.contains("error")) {
        const double theirs = p["median_ms"].get<double>();
        const double speedup = theirs / ours;  // = samples/s ratio at the same batch
        row["pytorch_ms"] = theirs;
        row["speedup_vs_pytorch"] = speedup;
        peer_cell = fmt::format("{:.2f}", theirs);
        ratio_cell = fmt::format("{:.2f}x", speedup);
        if (is_gpt) {
          row["pytorch_tokens_per_s"] = tokens_per_s(theirs);
          peer_tokens_cell = fmt::format("{:.0f}", tokens_per_s(theirs));
        }
        if (goal) {
          row["goal_met"] = speedup >= *goal;
          goal_cell += speedup >= *goal ? " met" : " NOT met";
        }
      } else {
        peer_cell = "n/a";
        std::cerr << "step_bench: PyTorch peer for " << name << ": "
                  << p["error"].get<std::string>() << "\n";
      }
    }
    if (step.kernels) {
      std::optional<bench::ProfiledSide> peer_side;
      if (peer_kernels) peer_side = bench::ProfiledSide{"PyTorch", *peer_kernels, peer_ms};
      profiles += "\n" + bench::compare_profiles(
                              fmt::format("where the GPU time goes: {}, batch {}", name, batch),
                              {"lockstep", *step.kernels, ours}, peer_side);
      row["kernel_profile"] = {{"lockstep", step.kernels->to_json()}};
      if (peer_kernels) row["kernel_profile"]["pytorch"] = peer_kernels->to_json();
    }
    if (is_gpt) {
      gpt_note = fmt::format("gpt: {}vocab {}, block {}, {} layers, {} heads, n_embd {}; batch "
                             "{} x {} tokens; {} parameters (PyTorch: {}){}\n",
                             device.is_cuda() ? "GPT-2 124M, " : "", gpt.vocab_size,
                             gpt.block_size, gpt.n_layer, gpt.n_head, gpt.n_embd, batch, seq_len,
                             step.parameters, peer_parameters,
                             gpt.checkpoint_blocks ? "; blocks checkpointed" : "");
    }
    results.push_back(row);
    std::vector<std::string> cells{name,
                                   device_str,
                                   is_gpt ? fmt::format("{}x{}", batch, seq_len)
                                          : std::to_string(batch),
                                   std::to_string(o.threads),
                                   fmt::format("{:.2f}", ours),
                                   peer_cell,
                                   ratio_cell};
    if (has_gpt) {
      cells.push_back(tokens_cell);
      cells.push_back(peer_tokens_cell);
      cells.push_back(peak_cell);
    }
    if (device.is_cuda()) cells.push_back(goal_cell);
    rows.push_back(cells);
  }

  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  if (o.json_out) {
    json out = {{"benchmark", "step_bench"}, {"date", date}, {"machine", machine},
                {"device", device_str}, {"steps", o.steps}, {"warmup", o.warmup},
                {"amp", o.amp},         {"results", results}};
    if (device.is_cuda()) {
      out["gpu"] = bench::device_name(device);
      out["tf32"] = o.tf32;
      out["cudnn_benchmark"] = o.cudnn_benchmark == "on";
    }
    std::cout << out.dump(2) << "\n";
    std::cerr << profiles;  // beside the JSON: in the log
  } else {
    fmt::print("step_bench {} on {} (median of {} steps after {} warm-up{}{})\n", date, machine,
               o.steps, o.warmup,
               device.is_cuda() ? fmt::format("; TF32 {}; cuDNN benchmark {}",
                                              o.tf32 ? "on" : "off", o.cudnn_benchmark)
                                : "",
               o.amp == "none" ? "" : "; autocast " + o.amp);
    std::vector<std::string> header{"model", "device", "batch", "threads", "lockstep ms/step",
                                    "PyTorch ms/step", "lockstep speedup"};
    if (has_gpt) {
      header.push_back("lockstep tokens/s");
      header.push_back("PyTorch tokens/s");
      header.push_back("lockstep peak MiB");
    }
    if (device.is_cuda()) header.push_back("goal");
    fmt::print("{}{}{}", bench::format_table(header, rows), gpt_note, profiles);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Time forward+backward+SGD of the benchmark models, beside PyTorch."};
  app.add_option("--model", o.models, "mlp, cnn, resnet18 and/or gpt (default: mlp and cnn)")
      ->check(CLI::IsMember(step_model_names()))
      ->delimiter(',');
  app.add_option("--batch-size", o.batch_size,
                 "samples per step (default: 64 for mlp and cnn, 256 for resnet18, 8 sequences "
                 "for gpt)")
      ->check(cli_checks::positive);
  app.add_option("--seq-len", o.seq_len,
                 "tokens per sequence, gpt only (default: its block_size, 128 on the CPU, 1024 on "
                 "CUDA)")
      ->check(cli_checks::positive);
  app.add_option("--steps", o.steps, "timed steps (median reported)")->check(cli_checks::positive);
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(cli_checks::non_negative);
  app.add_option("--threads", o.threads, "threads for both lockstep and PyTorch")
      ->check(cli_checks::positive);
  app.add_option("--device", o.device, "cpu or cuda (cuda:0)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_flag("--tf32", o.tf32, "TF32 tensor cores for f32 matmul and conv, on both sides");
  app.add_option("--cudnn-benchmark", o.cudnn_benchmark,
                 "CUDA: time cuDNN's convolution engines at each new shape and keep the fastest, "
                 "on both sides (torch.backends.cudnn.benchmark)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_flag("--checkpoint", o.checkpoint,
               "gpt only: checkpoint every block (recompute its activations in backward)");
  app.add_option("--amp", o.amp, "autocast dtype for forward and loss: none, bf16, f16")
      ->check(CLI::IsMember({"none", "bf16", "f16"}))
      ->capture_default_str();
  app.add_option("--kernel-trace", o.kernel_trace,
                 "CUDA: trace this many more steps' kernels on both sides and show where the "
                 "GPU time goes")
      ->check(cli_checks::non_negative);
  app.add_flag("--json", o.json_out, "print JSON instead of a table");
  app.add_flag("!--no-peer", o.peer, "skip PyTorch");
  app.add_option("--python", o.python, "Python with torch for the peer")->capture_default_str();
  app.add_option("--peer-script", o.peer_script);
  CLI11_PARSE(app, argc, argv);

  try {
    return run(o);
  } catch (const std::exception& e) {
    fmt::print(stderr, "step_bench: error: {}\n", e.what());
    return 1;
  }
}
