// Trains the Fashion-MNIST MLP or CNN with DistributedDataParallel on one or
// more processes and reports its accuracy on the test set.
//
//   build/bin/fashion_mnist --model cnn --epochs 2                      (one process)
//   build/bin/lockstep-run -np 2 build/bin/fashion_mnist --model cnn --epochs 2
//       --batch-size 32 --sync-bn                                        (two ranks)
//   mpirun -np 2 build/bin/fashion_mnist --model cnn --batch-size 32     (Open MPI)
//   ... --device cpu                      (the CPU even where there are GPUs)
//   ... --optimizer adamw --lr-schedule warmup-cosine --zero
//   ... --checkpoint-dir ckpt --checkpoint-every 200 [--resume]
//   ... --log-json run.json               (the curve, for scripts/plot-benchmarks)
//
// Each rank trains on its DistributedSampler shard with --batch-size samples
// per step (the global batch is world size times that), on its own GPU where
// there are GPUs (distributed/device_select.h; NCCL then all-reduces), else on
// the CPU; only rank 0 prints.
// With --checkpoint-dir, rank 0 saves every --checkpoint-every steps (and at
// each epoch's end, with the test accuracy as the metric that picks the best
// checkpoint); --resume continues the run from its newest checkpoint exactly
// where it was. The checkpoints belong to the run (train/training_run.h): a
// new run refuses a directory that holds another run's (--restart moves them
// aside), and a resume refuses settings that would change what the run
// computes (resume_settings.h), the data loaded from --data included, while
// --lr, --epochs and the like may change; options left out take the run's
// saved values.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lockstep/collectives/init.h"
#include "lockstep/models/models.h"
#include "lockstep/nn/ddp/distributed_data_parallel.h"
#include "lockstep/nn/join.h"
#include "lockstep/nn/sync_batch_norm.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/data/distributed_sampler.h"
#include "lockstep/runtime/data/loader.h"
#include "lockstep/distributed/device_select.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/threads.h"
#include "lockstep/train/data_digest.h"
#include "lockstep/train/training_checkpoint.h"
#include "lockstep/train/training_run.h"
#include "common/cli_checks.h"
#include "common/loss_window.h"
#include "common/run_support.h"
#include "optimizer_setup.h"
#include "options.h"
#include "resume_settings.h"
#include "training_log.h"

namespace fashion_mnist {
namespace {

using namespace lockstep;
using runtime::Tensor;

using examples::print;

// Accuracy over the whole test set: each rank classifies its shard (every
// sample exactly once across ranks, no padding), then one all-reduce sums the
// correct predictions and the counts. Unpadded shards can differ by a batch;
// the Join keeps a rank that has run out answering the others' collectives
// on an empty batch, so a model whose forward communicates (SyncBatchNorm,
// DDP's buffer broadcast) cannot mismatch, and the empty batch adds nothing
// to either count. Every rank first takes rank 0's buffers (BatchNorm's
// running statistics, which each rank's last forward updated from its own
// batch): the accuracy is that of the one model a checkpoint saves, and a run
// resumed from it reports the same.
double evaluate(nn::DistributedDataParallel& ddp, const runtime::Dataset& data,
                collectives::ProcessGroup& group, const runtime::Device& device) {
  ddp.broadcast_parameters();
  nn::Module& model = ddp.module();
  runtime::NoGradGuard no_grad;
  model.eval();
  auto sampler = std::make_unique<runtime::DistributedSampler>(
      data.size(), group,
      runtime::DistributedSamplerOptions{.shuffle = false, .pad = false});
  runtime::DataLoader loader(data, std::move(sampler), {.batch_size = 1000});
  int64_t correct = 0, seen = 0;
  nn::Join join(group);
  for (const runtime::Batch& b : join.batches(loader)) {
    Tensor pred = runtime::argmax(model(b.x.to(device)), 1);
    correct += static_cast<int64_t>(runtime::sum(runtime::eq(pred, b.y.to(device))).item());
    seen += b.size();
  }
  Tensor totals = Tensor::from_vector<int64_t>({correct, seen}, {2});
  group.allreduce(totals, {.op = collectives::ReduceOp::Sum})->wait();
  const auto t = totals.to_vector<int64_t>();
  LOCKSTEP_CHECK(t[1] == data.size(), "evaluation counted {} test samples, the set has {}", t[1],
                 data.size());
  model.train();
  return static_cast<double>(t[0]) / static_cast<double>(t[1]);
}

// "1 rank (shm backend)" on the CPU; "2 ranks on cuda:0, cuda:1 (nccl backend)"
// on GPUs, from every rank's device.
std::string ranks_line(collectives::ProcessGroup& group, const runtime::Device& device) {
  const int world = group.size();
  const std::string ranks = fmt::format("{} rank{}", world, world > 1 ? "s" : "");
  Tensor mine = Tensor::from_vector<int64_t>({device.is_cuda() ? device.index : -1}, {1});
  Tensor all = Tensor::zeros({world}, runtime::DType::i64);
  group.allgather(all, mine)->wait();
  const auto indices = all.to_vector<int64_t>();
  if (std::all_of(indices.begin(), indices.end(), [](int64_t i) { return i < 0; }))
    return fmt::format("{} ({} backend)", ranks, group.backend());
  std::vector<std::string> names;
  for (int64_t i : indices) names.push_back(i < 0 ? "cpu" : fmt::format("cuda:{}", i));
  return fmt::format("{} on {} ({} backend)", ranks, fmt::join(names, ", "), group.backend());
}

int run(Options o) {
  runtime::set_num_threads(o.threads);
  // The rank's device first: the group's default backend follows it (nccl
  // with a GPU per rank), and NCCL's communicator lives on it.
  const runtime::Device device = distributed::select_device({.request = o.device});
  auto group = collectives::init_process_group({.backend = o.backend});
  const int rank = group->rank(), world = group->size();
  // The checkpoint directory first: one that cannot be written, or that
  // holds another run, stops every rank before the data is even read.
  std::optional<train::TrainingRun> checkpoints = examples::open_checkpoints(
      {o.checkpoint_dir, o.keep_last, o.given.contains("keep_last"), o.resume, o.restart},
      runtime::BestMode::max, *group);
  if (checkpoints && checkpoints->saved) {
    take_saved_settings(o, *checkpoints->saved);
    runtime::set_num_threads(o.threads);
  }
  runtime::manual_seed(o.seed);  // the run's seed: a resume may have taken it from the checkpoint
  const auto norm = models::kFashionMnistNormalization;
  auto train = models::load_fashion_mnist(o.data, models::Split::train, norm, o.train_samples);
  auto test = models::load_fashion_mnist(o.data, models::Split::test, norm, o.test_samples);
  std::shared_ptr<nn::Module> model =
      o.model == "cnn" ? models::fashion_cnn(o.seed) : models::fashion_mlp(o.seed);
  model->to(device);
  bool synced_bn = false;
  if (o.sync_bn) {
    model = nn::convert_sync_batchnorm(model, group);
    const auto modules = model->named_modules();
    synced_bn = std::any_of(modules.begin(), modules.end(), [](const auto& m) {
      return dynamic_cast<const nn::SyncBatchNorm*>(m.second) != nullptr;
    });
    if (!synced_bn)
      print(group->rank(), "note: --sync-bn changes nothing: the {} has no BatchNorm layer\n",
            o.model);
  }
  auto ddp = std::make_shared<nn::DistributedDataParallel>(model, group);
  auto sampler = std::make_unique<runtime::DistributedSampler>(
      train.size(), *group, runtime::DistributedSamplerOptions{.seed = o.seed});
  runtime::DataLoader loader(train, std::move(sampler), {.batch_size = o.batch_size});
  const int64_t batches = loader.num_batches();
  auto opt = make_optimizer(o, model->parameters(), group);
  auto sched = make_scheduler(o, *opt, batches, batches * o.epochs);

  const std::string ranks = ranks_line(*group, device);
  print(rank, "model {} ({} parameters{}), {} training and {} test samples, {} x "
        "batch {}, {} lr {}{}{}, seed {}\n",
        o.model, model->num_parameters(), synced_bn ? ", SyncBatchNorm" : "", train.size(),
        test.size(), ranks, o.batch_size, o.optimizer,
        learning_rate(o), o.lr_schedule == "none" ? "" : " (" + o.lr_schedule + ")",
        o.zero ? ", ZeRO" : "", o.seed);

  TrainingLog log(rank == 0 ? o.log_json : std::string(),
                  {{"model", o.model}, {"parameters", model->num_parameters()},
                   {"ranks", world}, {"backend", group->backend()},
                   {"device", device.str()}, {"batch_size", o.batch_size},
                   {"epochs", o.epochs}, {"train_samples", train.size()},
                   {"test_samples", test.size()}, {"optimizer", o.optimizer},
                   {"lr", learning_rate(o)}, {"lr_schedule", o.lr_schedule},
                   {"sync_bn", o.sync_bn}, {"zero", o.zero}, {"seed", o.seed}});

  train::TrainingParts parts{.model = model.get(), .optimizer = opt.get(), .scheduler = sched.get()};
  train::TrainingProgress progress;
  if (checkpoints) {
    // What was loaded, as loaded: a resume on other files under --data is refused.
    train::DataDigest data;
    data.add("train.x", train.x()).add("train.y", train.y());
    data.add("test.x", test.x()).add("test.y", test.y());
    const std::string digest = train::same_on_every_rank(data, o.data, *group);
    // Refuses a resume with other fixed settings, naming each, on every rank.
    const train::RunSettings now =
        run_settings(o, train.size(), test.size(), digest, sched.get());
    std::vector<train::SettingChange> changes;
    try {
      changes = examples::record_settings(*checkpoints, now, rank);
    } catch (const Error& e) {
      if (!checkpoints->saved) throw;
      throw Error(e.what() + schedule_change_notes(*checkpoints->saved, now));
    }
    const bool lr_changed = std::any_of(changes.begin(), changes.end(),
                                        [](const auto& c) { return c.name == "lr"; });
    if (const auto& last = checkpoints->resume_from) {
      std::optional<double> lr;
      if (lr_changed) lr = learning_rate(o);
      progress = train::load_training_checkpoint(last->path, parts, *group, {.lr = lr});
      log.continue_from(progress.step);
      print(rank, "resumed from {}: epoch {}, batch {}/{}, step {}\n", last->path.string(),
            progress.epoch + 1, progress.batch, batches, progress.step);
    }
  }
  // The mean loss over the epoch's steps since the last log line, and over the ranks.
  examples::LossWindow window;
  if (checkpoints && checkpoints->resume_from)
    window = examples::LossWindow::restore(progress, progress.batch,
                                           checkpoints->resume_from->path.string(),
                                           "fashion_mnist");
  auto save = [&](train::TrainingProgress at, std::optional<double> metric) {
    if (!checkpoints) return;
    // A new epoch starts a new window. Rank 0 saves it: the ranks' mean first.
    if (at.batch != 0) window.average_over(*group);
    (at.batch == 0 ? examples::LossWindow{} : window).save_to(at);
    log.write();  // first: the file then holds every window up to the checkpoint's step
    auto entry = train::save_training_checkpoint(checkpoints->dir, parts, at, metric, *group);
    print(rank, "saved {}\n", entry.path.string());
  };

  using Clock = std::chrono::steady_clock;
  std::optional<double> accuracy;
  for (; progress.epoch < o.epochs; ++progress.epoch, progress.batch = 0) {
    loader.set_epoch(progress.epoch);
    // Throughput counts the training steps only, as gpt_train's: checkpoint
    // and log writes between them are not training.
    double window_secs = 0;
    int64_t window_samples = 0;  // trained in this process: throughput
    while (progress.batch < batches) {
      const auto step_start = Clock::now();
      const runtime::Batch b = loader.batch(progress.batch);
      Tensor loss = runtime::cross_entropy((*ddp)(b.x.to(device)), b.y.to(device));
      opt->zero_grad();
      loss.backward();
      if (o.clip_grad_norm > 0) examples::clip_gradients(*opt, o.clip_grad_norm);
      opt->step();
      if (sched) sched->step();
      ++progress.batch;
      ++progress.step;
      const double step_loss = loss.item();
      examples::check_loss_finite(step_loss, progress.step, rank);
      window_secs += std::chrono::duration<double>(Clock::now() - step_start).count();
      window.add(step_loss);
      window_samples += b.size() * world;
      if (progress.batch % o.log_every == 0 || progress.batch == batches) {
        const double secs = window_secs;
        const double mean_loss = window.global_mean(*group);  // of the global batches
        print(rank, "epoch {} step {}/{} loss {:.6f} samples/s {:.0f}\n", progress.epoch + 1,
              progress.batch, batches, mean_loss, window_samples / secs);
        log.window(progress.epoch + 1, progress.step, mean_loss, window_samples / secs);
        window_secs = 0;
        window_samples = 0;
        window.reset();
      }
      if (o.checkpoint_every > 0 && progress.step % o.checkpoint_every == 0 &&
          progress.batch < batches)
        save(progress, std::nullopt);
    }
    // Evaluation leaves the parameters as they are: the digest is the same either way.
    if (checkpoints || !o.log_json.empty() || progress.epoch + 1 == o.epochs) {
      accuracy = evaluate(*ddp, test, *group, device);
      print(rank, "epoch {} test accuracy: {:.4f}\n", progress.epoch + 1, *accuracy);
      log.epoch_end(progress.epoch + 1, progress.step, *accuracy);
      if (!progress.best_metric || *accuracy > *progress.best_metric) progress.best_metric = accuracy;
      // Saved as the start of the next epoch, where a resumed run goes on.
      train::TrainingProgress next = progress;
      ++next.epoch;
      next.batch = 0;
      save(next, accuracy);
    }
  }
  // Resumed after the last epoch: nothing trained, report what was loaded.
  if (!accuracy) accuracy = evaluate(*ddp, test, *group, device);
  print(rank, "test accuracy: {:.4f}\n", *accuracy);
  print(rank, "parameters digest: {:016x}\n", examples::parameters_digest(*model));
  return 0;
}

}  // namespace
}  // namespace fashion_mnist

int main(int argc, char** argv) {
  fashion_mnist::Options o;
  CLI::App app{"Train a Fashion-MNIST classifier with lockstep on one or more processes."};
  app.add_option("--model", o.model, "mlp or cnn")->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--epochs", o.epochs, "passes over the training set")->check(cli_checks::positive);
  app.add_option("--batch-size", o.batch_size, "samples per step on each rank")
      ->check(cli_checks::positive);
  app.add_option("--train-samples", o.train_samples,
                 "train on the first N training samples only (quick runs); default: all")
      ->check(cli_checks::positive);
  app.add_option("--test-samples", o.test_samples,
                 "evaluate on the first N test samples only (quick runs); default: all")
      ->check(cli_checks::positive);
  app.add_option("--optimizer", o.optimizer, "sgd, adam or adamw")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  app.add_option("--lr", o.lr, "learning rate (default: 0.05 for sgd, 1e-3 for adam and adamw)")
      ->check(cli_checks::positive);
  app.add_option("--momentum", o.momentum, "SGD momentum")->check(CLI::Range(0.0, 1.0));
  app.add_option("--weight-decay", o.weight_decay,
                 "weight decay (default 0, AdamW's own default 1e-2; 0 turns AdamW's off)")
      ->check(cli_checks::non_negative);
  app.add_option("--lr-schedule", o.lr_schedule,
                 "none, step (x0.5 each epoch), multistep (x0.1 at 50% and 75%), cosine, warmup "
                 "(linear), warmup-cosine or onecycle (peak at --lr); stepped every step")
      ->check(CLI::IsMember({"none", "step", "multistep", "cosine", "warmup", "warmup-cosine",
                             "onecycle"}));
  app.add_option("--warmup-steps", o.warmup_steps, "steps of warmup for warmup schedules")
      ->check(cli_checks::positive);
  app.add_option("--clip-grad-norm", o.clip_grad_norm,
                 "clip gradients to this global L2 norm (default: no clipping)")
      ->check(cli_checks::positive);
  app.add_flag("--zero", o.zero,
               "shard the optimizer state across ranks (ZeroRedundancyOptimizer)");
  app.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "directory for checkpoints (rank 0 writes; keeps --keep-last plus the best)");
  app.add_option("--checkpoint-every", o.checkpoint_every,
                 "also checkpoint every N steps (default: only at each epoch's end)")
      ->check(cli_checks::positive);
  app.add_option("--keep-last", o.keep_last, "checkpoints kept besides the best")
      ->check(cli_checks::positive);
  auto* resume = app.add_flag(
      "--resume", o.resume,
      "continue the run in --checkpoint-dir from its newest checkpoint (none yet: start fresh); "
      "options left out take the run's saved values, and --lr (not under onecycle), --epochs "
      "(not under a --lr-schedule that spans the run), --clip-grad-norm, "
      "--log-every, --checkpoint-every, --keep-last and --threads may change");
  app.add_flag("--restart", o.restart,
               "start a new run in --checkpoint-dir, moving the checkpoints there into a "
               "subdirectory (nothing is deleted)")
      ->excludes(resume);
  app.add_option("--seed", o.seed, "seed for initialisation and shuffling");
  app.add_option("--data", o.data, "directory with the Fashion-MNIST IDX files");
  app.add_option("--log-every", o.log_every, "steps between progress lines")
      ->check(cli_checks::positive);
  app.add_option("--log-json", o.log_json,
                 "also write the loss, throughput and test accuracy as JSON to FILE (rank 0; "
                 "replaced after every epoch and before every checkpoint; "
                 "scripts/plot-benchmarks draws it)");
  app.add_option("--threads", o.threads, "OpenBLAS threads per rank")->check(cli_checks::positive);
  app.add_flag("--sync-bn", o.sync_bn,
               "replace BatchNorm with SyncBatchNorm (statistics of the global batch)");
  app.add_option("--device", o.device,
                 "auto (each rank on its own GPU where there are GPUs, else the CPU), cpu, cuda "
                 "or cuda:N; default: LOCKSTEP_DEVICE, else auto");
  app.add_option("--backend", o.backend,
                 "process-group backend (nccl, shm, shm+gloo, gloo, mpi); default: "
                 "LOCKSTEP_BACKEND, else nccl with a GPU per rank, shm when all ranks share a "
                 "node, shm+gloo across nodes");
  CLI11_PARSE(app, argc, argv);
  if ((o.resume || o.restart) && o.checkpoint_dir.empty()) {
    fmt::print(stderr, "fashion_mnist: error: {} needs --checkpoint-dir DIR (where the run's "
                       "checkpoints are)\n", o.resume ? "--resume" : "--restart");
    return 2;
  }
  for (const char* name :
       {"lr", "epochs", "clip_grad_norm", "log_every", "checkpoint_every", "model", "sync_bn",
        "batch_size", "train_samples", "test_samples", "optimizer", "momentum", "weight_decay",
        "zero", "lr_schedule", "warmup_steps", "data", "seed", "keep_last", "threads"}) {
    std::string flag = std::string("--") + name;
    std::replace(flag.begin(), flag.end(), '_', '-');
    if (app.count(flag) > 0) o.given.insert(name);
  }
  try {
    return fashion_mnist::run(o);
  } catch (const std::exception& e) {
    fmt::print(stderr, "fashion_mnist: error: {}\n", e.what());
    return 1;
  }
}
