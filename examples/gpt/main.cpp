// Trains a byte-level GPT (models/gpt.h) with DistributedDataParallel on the
// fortune databases of Debian's `fortunes` package, reports the validation
// loss in bits per byte against the unigram baseline, and prints a sample.
//
//   build/bin/gpt_train                                         (one process)
//   build/bin/lockstep-run -np 2 build/bin/gpt_train            (two ranks)
//   ... --n-layer 6 --n-embd 256 --seq-len 256 --steps 2000     (a bigger model)
//   ... --checkpoint-dir ckpt --checkpoint-every 100 [--resume]
//
// Data (corpus.h): every 10th fortune entry is held out for validation; each
// step, each rank trains on --batch-size windows of --seq-len + 1 bytes at
// offsets drawn from a stream keyed by the seed and the step, so a resumed
// run sees exactly the batches an uninterrupted one would. Optimizer: AdamW
// (weight decay on matrices and embeddings only, as nanoGPT), linear warmup
// then cosine to --min-lr, gradient clipping at --clip-grad-norm.
// Checkpoints and --resume/--restart behave as fashion_mnist's: the files
// belong to the run, and a resume refuses other model, batch, optimizer,
// schedule, data (its path, and a digest of the text and split loaded from
// it) or seed settings (run_settings() below); the clipping, block
// checkpointing, the number of validation windows and the logging, evaluation
// and checkpoint intervals may change, and options left out take the run's
// saved values. The elapsed time of the progress lines is the run's training time:
// a resumed run goes on from the time its checkpoint saved.
//   ... --amp bf16 | f16 [--checkpoint-blocks]
// --amp runs forward and loss under autocast (runtime/autocast.h), f16 with a
// GradScaler whose state rides in the checkpoints; --checkpoint-blocks
// recomputes each block's activations in backward. A resume keeps --amp
// (it changes what the run computes); --checkpoint-blocks changes nothing
// but memory and time, and a resume that leaves it out keeps the run's
// (--no-checkpoint-blocks turns it off).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/cli_checks.h"
#include "common/loss_window.h"
#include "common/run_support.h"
#include "common/saved_settings.h"
#include "corpus.h"
#include "lockstep/collectives/init.h"
#include "lockstep/models/models.h"
#include "lockstep/nn/ddp/distributed_data_parallel.h"
#include "lockstep/optim/adam.h"
#include "lockstep/optim/grad_scaler.h"
#include "lockstep/optim/lr_scheduler.h"
#include "lockstep/optim/zero_redundancy_optimizer.h"
#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/checkpoint/metadata_text.h"
#include "lockstep/distributed/device_select.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/threads.h"
#include "lockstep/train/data_digest.h"
#include "lockstep/train/training_checkpoint.h"
#include "lockstep/train/training_run.h"
#include "options.h"

namespace gpt_example {
namespace {

using namespace lockstep;
using runtime::Tensor;

using examples::print;

models::GptConfig model_config(const Options& o) {
  return {.vocab_size = 256,
          .block_size = o.seq_len,
          .n_layer = o.n_layer,
          .n_head = o.n_head,
          .n_embd = o.n_embd,
          .dropout = o.dropout,
          .bias = o.bias,
          .checkpoint_blocks = o.checkpoint_blocks};
}

// The autocast scope --amp asks for (disabled for "none").
runtime::AutocastGuard amp_scope(const Options& o) {
  return runtime::autocast({.dtype = o.amp == "f16" ? runtime::DType::f16 : runtime::DType::bf16,
                            .enabled = o.amp != "none"});
}

// Mean validation loss in bits per byte over the evaluation windows: each
// rank takes every world-th window, one all-reduce sums losses and counts.
double evaluate(models::Gpt& model, const std::string& text, const Options& o,
                collectives::ProcessGroup& group, const runtime::Device& device) {
  runtime::NoGradGuard no_grad;
  model.eval();
  const auto offsets = evaluation_offsets(text, o.eval_windows, o.seq_len);
  double nats = 0, count = 0;
  std::vector<int64_t> mine;
  for (size_t w = static_cast<size_t>(group.rank()); w < offsets.size();
       w += static_cast<size_t>(group.size()))
    mine.push_back(offsets[w]);
  for (size_t at = 0; at < mine.size(); at += static_cast<size_t>(o.batch_size)) {
    const std::vector<int64_t> part(mine.begin() + static_cast<std::ptrdiff_t>(at),
                                    mine.begin() + static_cast<std::ptrdiff_t>(std::min(
                                                       mine.size(), at + static_cast<size_t>(o.batch_size))));
    const TokenBatch b = windows_at(text, part, o.seq_len);
    const auto amp = amp_scope(o);
    const nn::Values out = model.forward_values({b.x.to(device), b.y.to(device)});
    const double tokens = static_cast<double>(b.x.numel());
    nats += out.tensor(1).item() * tokens;
    count += tokens;
  }
  Tensor totals = Tensor::from_vector<double>({nats, count}, {2});
  group.allreduce(totals, {.op = collectives::ReduceOp::Sum})->wait();
  const auto t = totals.to_vector<double>();
  model.train();
  return t[0] / t[1] / std::log(2.0);
}

// Decay on matrices and embeddings, none on biases and LayerNorm (nanoGPT).
std::unique_ptr<optim::Optimizer> make_optimizer(const Options& o, nn::Module& model,
                                                 std::shared_ptr<collectives::ProcessGroup> group) {
  std::vector<Tensor> decay, no_decay;
  for (const Tensor& p : model.parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  std::vector<optim::ParamGroup> groups{{decay, {{"weight_decay", o.weight_decay}}},
                                        {no_decay, {{"weight_decay", 0.0}}}};
  optim::OptimizerFactory factory = [&o](std::vector<optim::ParamGroup> g) {
    optim::AdamWOptions w;
    w.lr = o.lr;
    w.beta2 = 0.99;
    w.weight_decay = o.weight_decay;
    return std::unique_ptr<optim::Optimizer>(std::make_unique<optim::AdamW>(std::move(g), w));
  };
  if (o.zero)
    return std::make_unique<optim::ZeroRedundancyOptimizer>(std::move(groups), std::move(group),
                                                            factory);
  return factory(std::move(groups));
}

// What a resume must match (fixed) and what it may change.
train::RunSettings run_settings(const Options& o, const std::string& data_digest,
                                const optim::LRScheduler* sched) {
  // bias=off only when off: runs saved before the option resume as they are.
  return {.fixed = {{"model", fmt::format("gpt n_layer={} n_head={} n_embd={} seq_len={} "
                                          "dropout={}{}",
                                          o.n_layer, o.n_head, o.n_embd, o.seq_len, o.dropout,
                                          o.bias ? "" : " bias=off")},
                    {"batch_size", std::to_string(o.batch_size)},
                    {"optimizer", fmt::format("adamw lr={} min_lr={} weight_decay={}", o.lr,
                                              o.min_lr, o.weight_decay)},
                    {"zero", o.zero ? "on" : "off"},
                    {"amp", o.amp},
                    {"lr_schedule", train::schedule_setting(sched)},
                    {train::kDataSetting, o.data},
                    {train::kDataDigestSetting, data_digest},
                    {"seed", std::to_string(o.seed)}},
          .changeable = {{"clip_grad_norm", fmt::format("{}", o.clip_grad_norm)},
                         {"checkpoint_blocks", o.checkpoint_blocks ? "on" : "off"},
                         {"log_every", std::to_string(o.log_every)},
                         {"eval_every", std::to_string(o.eval_every)},
                         {"eval_windows", std::to_string(o.eval_windows)},
                         {"checkpoint_every", std::to_string(o.checkpoint_every)},
                         {"threads", std::to_string(o.threads)}}};
}

void take_saved_settings(Options& o, const train::RunSettings& saved) {
  const examples::SavedSettings s(saved, o.given);
  s.take("clip_grad_norm", "clip_grad_norm", o.clip_grad_norm);
  // What let the model fit in the device's memory; --no-checkpoint-blocks drops it.
  s.take("checkpoint_blocks", "checkpoint_blocks", o.checkpoint_blocks);
  s.take("log_every", "log_every", o.log_every);
  s.take("eval_every", "eval_every", o.eval_every);
  // The validation set: the best checkpoint is chosen by losses measured on it.
  s.take("eval_windows", "eval_windows", o.eval_windows);
  s.take("checkpoint_every", "checkpoint_every", o.checkpoint_every);
  // OpenBLAS splits a product's sums by its thread count: another count
  // changes the last bits.
  s.take("threads", "threads", o.threads);
  s.take("n_layer", "model", o.n_layer, "n_layer");
  s.take("n_head", "model", o.n_head, "n_head");
  s.take("n_embd", "model", o.n_embd, "n_embd");
  s.take("seq_len", "model", o.seq_len, "seq_len");
  s.take("dropout", "model", o.dropout, "dropout");
  s.take("bias", "model", o.bias, "bias");
  s.take("batch_size", "batch_size", o.batch_size);
  s.take("lr", "optimizer", o.lr, "lr");
  s.take("min_lr", "optimizer", o.min_lr, "min_lr");
  s.take("weight_decay", "optimizer", o.weight_decay, "weight_decay");
  s.take("zero", "zero", o.zero);
  s.take("amp", "amp", o.amp);
  // The schedule recorded the run's length and its (clamped) warmup.
  s.take("steps", "lr_schedule", o.steps, "total_steps");
  s.take("warmup_steps", "lr_schedule", o.warmup_steps, "warmup_steps");
  s.take("data", train::kDataSetting, o.data);
  s.take("seed", "seed", o.seed);
}

// The run's training time up to a checkpoint, in its progress; 0 in one saved
// before gpt_train kept it.
constexpr const char* kElapsedKey = "elapsed_s";

double saved_elapsed_secs(const train::TrainingProgress& progress, const std::string& file) {
  const auto it = progress.user.find(kElapsedKey);
  if (it == progress.user.end()) return 0;
  const std::optional<double> secs = runtime::parse_metadata_number(it->second);
  LOCKSTEP_CHECK(secs && std::isfinite(*secs) && *secs >= 0,
                 "{}: the saved training time \"{}\" is not a number of seconds; the checkpoint "
                 "was not written by gpt_train", file, it->second);
  return *secs;
}

// Bytes as text, with anything unprintable but newline and tab escaped.
std::string printable(const std::vector<int64_t>& bytes) {
  std::string out;
  for (const int64_t b : bytes) {
    if (b == '\n' || b == '\t' || (b >= 32 && b < 127)) {
      out += static_cast<char>(b);
    } else {
      out += fmt::format("\\x{:02x}", b);
    }
  }
  return out;
}

int run(Options o) {
  runtime::set_num_threads(o.threads);
  const runtime::Device device = distributed::select_device({.request = o.device});
  auto group = collectives::init_process_group({.backend = o.backend});
  const int rank = group->rank(), world = group->size();
  std::optional<train::TrainingRun> checkpoints = examples::open_checkpoints(
      {o.checkpoint_dir, o.keep_last, o.given.contains("keep_last"), o.resume, o.restart},
      runtime::BestMode::min, *group);
  const bool resumed = checkpoints && checkpoints->saved;
  if (resumed) {
    take_saved_settings(o, *checkpoints->saved);
    runtime::set_num_threads(o.threads);
  }
  // Checked on the values the run goes on with: a resume took the ones left out.
  LOCKSTEP_CHECK(o.n_embd % o.n_head == 0, "--n-embd {} must be a multiple of --n-head {}{}",
                 o.n_embd, o.n_head,
                 resumed && !(o.given.contains("n_embd") && o.given.contains("n_head"))
                     ? " (the run's saved value of the one left out)"
                     : "");
  // The cosine runs from --lr to --min-lr: above it, the rate would rise past the peak. A
  // run that began so, before this check, resumes as it began (both are fixed settings).
  LOCKSTEP_CHECK(resumed || o.min_lr <= o.lr, "--min-lr {} is above --lr {}, the peak learning "
                 "rate; give a --min-lr of at most {}", o.min_lr, o.lr, o.lr);
  // The run's seed (a resume may have taken it from the checkpoint) plus the rank, as nanoGPT's
  // 1337 + rank: the default generator serves dropout alone (initialisation, batches and the
  // sample have their own), and seeded alike the ranks would drop the same units at the same
  // positions of their batches every step.
  runtime::manual_seed(o.seed + static_cast<uint64_t>(rank));
  const Corpus corpus = load_fortunes(o.data);
  const double unigram = unigram_bits_per_byte(corpus.train, corpus.validation);
  check_window_fits(corpus.train, "training", o.seq_len);
  check_window_fits(corpus.validation, "validation", o.seq_len);
  if (const int64_t windows = window_count(corpus.validation, o.seq_len); o.eval_windows > windows) {
    print(rank, "note: the held-out text has {} windows of {} bytes; --eval-windows {} uses "
          "each once\n", windows, o.seq_len + 1, o.eval_windows);
    o.eval_windows = windows;
  }

  auto model = models::gpt(model_config(o), o.seed);
  model->to(device);
  auto ddp = std::make_shared<nn::DistributedDataParallel>(model, group);
  auto opt = make_optimizer(o, *model, group);
  const int64_t warmup = std::min(o.warmup_steps, o.steps - 1);
  optim::WarmupCosineLR sched(*opt, {.warmup_steps = warmup,
                                     .total_steps = o.steps,
                                     .start_factor = 0.01,
                                     .eta_min = o.min_lr});

  print(rank, "corpus {}: {} files; {} training entries ({} bytes), {} held out ({} bytes)\n",
        o.data, corpus.files, corpus.train_entries, corpus.train.size(),
        corpus.validation_entries, corpus.validation.size());
  print(rank, "unigram baseline: {:.4f} bits/byte on the held-out entries\n", unigram);
  print(rank, "model gpt ({} parameters: {} layers, {} heads, width {}, context {}), {} "
        "rank{} x batch {} x {} bytes, adamw lr {} (warmup {}, cosine to {}), seed {}\n",
        model->num_parameters(), o.n_layer, o.n_head, o.n_embd, o.seq_len, world,
        world > 1 ? "s" : "", o.batch_size, o.seq_len, o.lr, warmup, o.min_lr, o.seed);
  if (o.amp != "none" || o.checkpoint_blocks)
    print(rank, "{}{}\n", o.amp != "none" ? "autocast " + o.amp : "",
          o.checkpoint_blocks ? (o.amp != "none" ? ", blocks checkpointed" : "blocks checkpointed")
                              : "");

  // Loss scaling for f16; every rank agrees on a skipped step.
  optim::GradScaler scaler(group, {.enabled = o.amp == "f16"});
  train::TrainingParts parts{
      .model = model.get(), .optimizer = opt.get(), .scheduler = &sched, .scaler = &scaler};
  train::TrainingProgress progress;
  if (checkpoints) {
    // The text and its split as loaded: a resume on other fortunes under --data is refused.
    train::DataDigest data;
    data.add("train", corpus.train).add("validation", corpus.validation);
    const std::string digest = train::same_on_every_rank(data, o.data, *group);
    examples::record_settings(*checkpoints, run_settings(o, digest, &sched), rank);
    if (const auto& last = checkpoints->resume_from) {
      progress = train::load_training_checkpoint(last->path, parts, *group);
      print(rank, "resumed from {}: step {}\n", last->path.string(), progress.step);
    }
  }
  // The mean loss over the steps since the last log line, and over the ranks.
  examples::LossWindow window;
  // The run's training time: a resumed run goes on from the time its checkpoint saved.
  using Clock = std::chrono::steady_clock;
  double earlier_secs = 0;
  if (checkpoints && checkpoints->resume_from) {
    const std::string file = checkpoints->resume_from->path.string();
    window = examples::LossWindow::restore(progress, progress.step, file, "gpt_train");
    earlier_secs = saved_elapsed_secs(progress, file);
  }
  auto start = Clock::now();
  const auto elapsed = [&] {
    return earlier_secs + std::chrono::duration<double>(Clock::now() - start).count();
  };
  const auto save = [&](std::optional<double> metric) {
    if (!checkpoints) return;
    progress.batch = progress.step;
    window.average_over(*group);  // rank 0 saves it: the ranks' mean
    window.save_to(progress);
    progress.user[kElapsedKey] = runtime::metadata_number(elapsed());
    auto entry = train::save_training_checkpoint(checkpoints->dir, parts, progress, metric, *group);
    print(rank, "saved {}\n", entry.path.string());
  };

  start = Clock::now();
  // Throughput counts the training steps only: evaluation and checkpoint
  // writes between them are not training tokens.
  double window_secs = 0;
  int64_t timed_steps = 0;  // of the window, in this process
  std::optional<double> val;
  while (progress.step < o.steps) {
    const auto step_start = Clock::now();
    const TokenBatch b =
        train_batch(corpus.train, progress.step, rank, world, o.batch_size, o.seq_len, o.seed);
    Tensor loss;
    {
      const auto amp = amp_scope(o);
      loss = ddp->forward_values({b.x.to(device), b.y.to(device)}).tensor(1);
    }
    opt->zero_grad();
    scaler.scale(loss).backward();
    if (o.clip_grad_norm > 0) {
      scaler.unscale_(*opt);
      examples::clip_gradients(*opt, o.clip_grad_norm);
    }
    const double step_lr = opt->param_groups()[0].options.at("lr");  // before sched.step()
    scaler.step(*opt);  // opt->step() unless f16 overflowed
    scaler.update();
    sched.step();
    ++progress.step;
    const double step_loss = loss.item();
    examples::check_loss_finite(step_loss, progress.step, rank);
    window_secs += std::chrono::duration<double>(Clock::now() - step_start).count();
    window.add(step_loss);
    ++timed_steps;
    if (progress.step % o.log_every == 0 || progress.step == o.steps) {
      const double tokens = static_cast<double>(timed_steps * o.batch_size * o.seq_len * world);
      const double mean_loss = window.global_mean(*group);  // of the global batches
      print(rank, "step {}/{} loss {:.6f} ({:.3f} bits/byte) lr {:.3g} tokens/s {:.0f} elapsed {:.0f}s\n",
            progress.step, o.steps, mean_loss, mean_loss / std::log(2.0),
            step_lr, tokens / window_secs, elapsed());
      window_secs = 0;
      window.reset();
      timed_steps = 0;
    }
    const bool eval_now = progress.step % o.eval_every == 0 || progress.step == o.steps;
    if (eval_now) {
      val = evaluate(*model, corpus.validation, o, *group, device);
      print(rank, "step {} validation {:.4f} bits/byte (unigram {:.4f})\n", progress.step, *val,
            unigram);
      if (!progress.best_metric || *val < *progress.best_metric) progress.best_metric = val;
    }
    const bool checkpoint_now =
        (o.checkpoint_every > 0 && progress.step % o.checkpoint_every == 0) || progress.step == o.steps;
    if (checkpoint_now) save(eval_now ? val : std::nullopt);
  }
  if (!val) val = evaluate(*model, corpus.validation, o, *group, device);
  print(rank, "validation: {:.4f} bits/byte against the unigram baseline's {:.4f}\n", *val, unigram);
  print(rank, "parameters digest: {:016x}\n", examples::parameters_digest(*model));
  if (rank == 0 && o.sample_bytes > 0) {
    model->eval();
    runtime::Generator g(o.seed);
    std::vector<int64_t> prompt;
    for (const char ch : o.prompt) prompt.push_back(static_cast<unsigned char>(ch));
    const auto text = models::sample(*model, prompt, o.sample_bytes, g, {.temperature = o.temperature});
    print(rank, "sample (temperature {}):\n{}{}\n", o.temperature, o.prompt, printable(text));
  }
  return 0;
}

}  // namespace
}  // namespace gpt_example

int main(int argc, char** argv) {
  gpt_example::Options o;
  CLI::App app{"Train a byte-level GPT on Debian's fortunes with lockstep on one or more processes."};
  app.add_option("--n-layer", o.n_layer, "transformer blocks")->check(cli_checks::positive);
  app.add_option("--n-head", o.n_head, "attention heads (dividing --n-embd)")
      ->check(cli_checks::positive);
  app.add_option("--n-embd", o.n_embd, "width")->check(cli_checks::positive);
  app.add_option("--seq-len", o.seq_len, "context length in bytes")->check(cli_checks::positive);
  app.add_option("--dropout", o.dropout, "dropout in training")->check(CLI::Range(0.0, 0.99));
  app.add_flag("--bias,!--no-bias", o.bias,
               "biases in the Linear and LayerNorm layers (--no-bias: none, as nanoGPT's "
               "bias=False)");
  app.add_flag("--checkpoint-blocks,!--no-checkpoint-blocks", o.checkpoint_blocks,
               "recompute each block's activations in backward (less memory, more time)");
  app.add_option("--amp", o.amp, "autocast dtype: none, bf16, f16 (with loss scaling)")
      ->check(CLI::IsMember({"none", "bf16", "f16"}))
      ->capture_default_str();
  app.add_option("--steps", o.steps, "optimizer steps")->check(cli_checks::positive);
  app.add_option("--batch-size", o.batch_size, "sequences per step on each rank")
      ->check(cli_checks::positive);
  app.add_option("--lr", o.lr, "peak learning rate")->check(cli_checks::positive);
  app.add_option("--min-lr", o.min_lr, "learning rate at the end of the cosine")
      ->check(cli_checks::non_negative);
  app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay on matrices")
      ->check(cli_checks::non_negative);
  app.add_option("--warmup-steps", o.warmup_steps, "linear warmup steps")
      ->check(cli_checks::non_negative);
  app.add_option("--clip-grad-norm", o.clip_grad_norm, "global gradient norm limit (0: none)")
      ->check(cli_checks::non_negative);
  app.add_flag("--zero", o.zero, "shard the optimizer state across ranks");
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "directory for checkpoints");
  app.add_option("--checkpoint-every", o.checkpoint_every, "also checkpoint every N steps")
      ->check(cli_checks::positive);
  app.add_option("--keep-last", o.keep_last, "checkpoints kept besides the best")
      ->check(cli_checks::positive);
  auto* resume = app.add_flag("--resume", o.resume,
                              "continue the run in --checkpoint-dir from its newest checkpoint; "
                              "options left out take the run's saved values");
  app.add_flag("--restart", o.restart, "start a new run in --checkpoint-dir (old files moved aside)")
      ->excludes(resume);
  app.add_option("--eval-every", o.eval_every, "steps between validation passes (and at the end)")
      ->check(cli_checks::positive);
  app.add_option("--eval-windows", o.eval_windows, "validation windows of --seq-len bytes")
      ->check(cli_checks::positive);
  app.add_option("--log-every", o.log_every, "steps between progress lines")
      ->check(cli_checks::positive);
  app.add_option("--prompt", o.prompt, "text the final sample continues");
  app.add_option("--sample-bytes", o.sample_bytes, "bytes to sample at the end (0: none)")
      ->check(cli_checks::non_negative);
  app.add_option("--temperature", o.temperature, "sampling temperature")
      ->check(cli_checks::positive);
  app.add_option("--seed", o.seed,
                 "seed for initialisation, batches, dropout (plus the rank) and sampling");
  app.add_option("--data", o.data, "directory of fortune databases");
  app.add_option("--threads", o.threads, "OpenBLAS threads per rank")->check(cli_checks::positive);
  app.add_option("--device", o.device, "auto, cpu, cuda or cuda:N (default: LOCKSTEP_DEVICE, else auto)");
  app.add_option("--backend", o.backend, "process-group backend (default: LOCKSTEP_BACKEND, else chosen)");
  CLI11_PARSE(app, argc, argv);
  if ((o.resume || o.restart) && o.checkpoint_dir.empty()) {
    fmt::print(stderr, "gpt_train: error: {} needs --checkpoint-dir DIR\n",
               o.resume ? "--resume" : "--restart");
    return 2;
  }
  if (o.sample_bytes > 0 && o.prompt.empty()) {
    fmt::print(stderr, "gpt_train: error: --prompt is empty; give the text the sample continues "
                       "(at least one byte), or --sample-bytes 0 for no sample\n");
    return 2;
  }
  for (const char* name :
       {"clip_grad_norm", "checkpoint_blocks", "log_every", "eval_every", "eval_windows",
        "checkpoint_every", "n_layer", "n_head", "n_embd", "seq_len", "dropout", "bias", "batch_size",
        "lr", "min_lr", "weight_decay", "zero", "amp", "steps", "warmup_steps", "data", "seed",
        "keep_last", "threads"}) {
    std::string flag = std::string("--") + name;
    std::replace(flag.begin(), flag.end(), '_', '-');
    if (app.count(flag) > 0) o.given.insert(name);
  }
  try {
    return gpt_example::run(o);
  } catch (const std::exception& e) {
    fmt::print(stderr, "gpt_train: error: {}\n", e.what());
    return 1;
  }
}
