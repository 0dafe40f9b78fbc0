// Trains the Fashion-MNIST MLP or CNN with DistributedDataParallel on one or
// more processes and reports test accuracy over the whole test set.
//
//   build/bin/fashion_mnist --model cnn --epochs 2                      (one process)
//   build/bin/lockstep-run -np 2 build/bin/fashion_mnist --model cnn --epochs 2
//       --batch-size 32 --sync-bn                                        (two ranks)
//   mpirun -np 2 build/bin/fashion_mnist --model cnn --batch-size 32     (Open MPI)
//
// Each rank trains on its DistributedSampler shard with --batch-size samples
// per step (the global batch is world size times that); only rank 0 prints.
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "lockstep/collectives/init.h"
#include "lockstep/nn/ddp/distributed_data_parallel.h"
#include "lockstep/nn/models.h"
#include "lockstep/nn/sync_batch_norm.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/data/distributed_sampler.h"
#include "lockstep/runtime/data/fashion_mnist.h"
#include "lockstep/runtime/data/loader.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/threads.h"

namespace {

using namespace lockstep;
using runtime::Tensor;

struct Options {
  std::string model = "mlp";
  int epochs = 1;
  int64_t batch_size = 64;
  double lr = 0.05;
  double momentum = 0.9;
  uint64_t seed = 0;
  std::string data = runtime::kFashionMnistDir;
  int log_every = 100;
  int threads = 1;
  bool sync_bn = false;
  std::string backend;
};

// Progress lines come from rank 0 only.
template <class... Args>
void print(int rank, fmt::format_string<Args...> format, Args&&... args) {
  if (rank != 0) return;
  fmt::print(format, std::forward<Args>(args)...);
  std::fflush(stdout);
}

// Accuracy over the whole test set: each rank classifies its shard (every
// sample exactly once across ranks, no padding), then one all-reduce sums the
// correct predictions and the counts.
double evaluate(nn::Module& model, const runtime::Dataset& data, collectives::ProcessGroup& group) {
  runtime::NoGradGuard no_grad;
  model.eval();
  auto sampler = std::make_unique<runtime::DistributedSampler>(
      data.size(), group.rank(), group.size(),
      runtime::DistributedSamplerOptions{.shuffle = false, .pad = false});
  runtime::DataLoader loader(data, std::move(sampler), {.batch_size = 1000});
  int64_t correct = 0, seen = 0;
  for (const runtime::Batch& b : loader) {
    Tensor pred = runtime::argmax(model(b.x), 1);
    correct += static_cast<int64_t>(runtime::sum(runtime::eq(pred, b.y)).item());
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

int run(const Options& o) {
  runtime::set_num_threads(o.threads);
  runtime::manual_seed(o.seed);
  auto group = collectives::init_process_group({.backend = o.backend});
  const int rank = group->rank(), world = group->size();
  auto train = runtime::load_fashion_mnist(o.data, runtime::Split::train);
  auto test = runtime::load_fashion_mnist(o.data, runtime::Split::test);
  std::shared_ptr<nn::Module> model =
      o.model == "cnn" ? nn::models::fashion_cnn(o.seed) : nn::models::fashion_mlp(o.seed);
  if (o.sync_bn) model = nn::convert_sync_batchnorm(model, group);
  auto ddp = std::make_shared<nn::DistributedDataParallel>(model, group);
  optim::SGD opt(model->parameters(), {.lr = o.lr, .momentum = o.momentum});
  auto sampler = std::make_unique<runtime::DistributedSampler>(
      train.size(), rank, world, runtime::DistributedSamplerOptions{.seed = o.seed});
  runtime::DataLoader loader(train, std::move(sampler), {.batch_size = o.batch_size});
  print(rank, "model {} ({} parameters{}), {} training and {} test samples, {} rank{} ({} backend) x "
        "batch {}, lr {}, momentum {}, seed {}\n",
        o.model, model->num_parameters(), o.sync_bn ? ", SyncBatchNorm" : "", train.size(),
        test.size(), world, world > 1 ? "s" : "", group->backend(), o.batch_size, o.lr,
        o.momentum, o.seed);

  using Clock = std::chrono::steady_clock;
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    loader.set_epoch(epoch);
    auto window_start = Clock::now();
    int64_t window_samples = 0;
    double window_loss = 0;
    int64_t window_steps = 0, step = 0;
    for (const runtime::Batch& b : loader) {
      Tensor loss = runtime::cross_entropy((*ddp)(b.x), b.y);
      opt.zero_grad();
      loss.backward();
      opt.step();
      ++step;
      window_loss += loss.item();
      window_samples += b.size() * world;
      ++window_steps;
      if (step % o.log_every == 0 || step == loader.num_batches()) {
        double secs = std::chrono::duration<double>(Clock::now() - window_start).count();
        print(rank, "epoch {} step {}/{} loss {:.4f} samples/s {:.0f}\n", epoch + 1, step,
              loader.num_batches(), window_loss / window_steps, window_samples / secs);
        window_start = Clock::now();
        window_samples = window_steps = 0;
        window_loss = 0;
      }
    }
  }
  const double accuracy = evaluate(*model, test, *group);
  print(rank, "test accuracy: {:.4f}\n", accuracy);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Train a Fashion-MNIST classifier with lockstep on one or more processes."};
  app.add_option("--model", o.model, "mlp or cnn")->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--epochs", o.epochs, "passes over the training set")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", o.batch_size, "samples per step on each rank")
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", o.lr, "SGD learning rate")->check(CLI::PositiveNumber);
  app.add_option("--momentum", o.momentum, "SGD momentum")->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", o.seed, "seed for initialisation and shuffling");
  app.add_option("--data", o.data, "directory with the Fashion-MNIST IDX files");
  app.add_option("--log-every", o.log_every, "steps between progress lines")
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", o.threads, "OpenBLAS threads per rank")->check(CLI::PositiveNumber);
  app.add_flag("--sync-bn", o.sync_bn,
               "replace BatchNorm with SyncBatchNorm (statistics of the global batch)");
  app.add_option("--backend", o.backend,
                 "process-group backend (shm, shm+gloo, gloo, mpi); default: LOCKSTEP_BACKEND, "
                 "else shm when all ranks share a node, shm+gloo across nodes");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    fmt::print(stderr, "fashion_mnist: error: {}\n", e.what());
    return 1;
  }
}
