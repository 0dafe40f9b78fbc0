// Trains the Fashion-MNIST MLP or CNN on one process and reports test accuracy.
//
//   build/bin/fashion_mnist --model cnn --epochs 2
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "lockstep/nn/models.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/runtime/autograd/grad_mode.h"
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
};

// Fraction of the dataset classified correctly; every sample counted once.
double evaluate(nn::Module& model, const runtime::Dataset& data) {
  runtime::NoGradGuard no_grad;
  model.eval();
  runtime::DataLoader loader(data, {.batch_size = 1000});
  int64_t correct = 0;
  for (const runtime::Batch& b : loader) {
    Tensor pred = runtime::argmax(model(b.x), 1);
    correct += static_cast<int64_t>(runtime::sum(runtime::eq(pred, b.y)).item());
  }
  model.train();
  return static_cast<double>(correct) / static_cast<double>(data.size());
}

int run(const Options& o) {
  runtime::set_num_threads(o.threads);
  runtime::manual_seed(o.seed);
  auto train = runtime::load_fashion_mnist(o.data, runtime::Split::train);
  auto test = runtime::load_fashion_mnist(o.data, runtime::Split::test);
  auto model = o.model == "cnn" ? nn::models::fashion_cnn(o.seed) : nn::models::fashion_mlp(o.seed);
  optim::SGD opt(model->parameters(), {.lr = o.lr, .momentum = o.momentum});
  runtime::DataLoader loader(train, {.batch_size = o.batch_size, .shuffle = true, .seed = o.seed});
  fmt::print("model {} ({} parameters), {} training and {} test samples, batch {}, lr {}, "
             "momentum {}, seed {}\n",
             o.model, model->num_parameters(), train.size(), test.size(), o.batch_size, o.lr,
             o.momentum, o.seed);

  using Clock = std::chrono::steady_clock;
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    loader.set_epoch(epoch);
    auto window_start = Clock::now();
    int64_t window_samples = 0;
    double window_loss = 0;
    int64_t window_steps = 0, step = 0;
    for (const runtime::Batch& b : loader) {
      Tensor loss = runtime::cross_entropy((*model)(b.x), b.y);
      opt.zero_grad();
      loss.backward();
      opt.step();
      ++step;
      window_loss += loss.item();
      window_samples += b.size();
      ++window_steps;
      if (step % o.log_every == 0 || step == loader.num_batches()) {
        double secs = std::chrono::duration<double>(Clock::now() - window_start).count();
        fmt::print("epoch {} step {}/{} loss {:.4f} samples/s {:.0f}\n", epoch + 1, step,
                   loader.num_batches(), window_loss / window_steps, window_samples / secs);
        std::fflush(stdout);
        window_start = Clock::now();
        window_samples = window_steps = 0;
        window_loss = 0;
      }
    }
  }
  fmt::print("test accuracy: {:.4f}\n", evaluate(*model, test));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Train a Fashion-MNIST classifier with lockstep on one process."};
  app.add_option("--model", o.model, "mlp or cnn")->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--epochs", o.epochs, "passes over the training set")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", o.batch_size, "samples per step")->check(CLI::PositiveNumber);
  app.add_option("--lr", o.lr, "SGD learning rate")->check(CLI::PositiveNumber);
  app.add_option("--momentum", o.momentum, "SGD momentum")->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", o.seed, "seed for initialisation and shuffling");
  app.add_option("--data", o.data, "directory with the Fashion-MNIST IDX files");
  app.add_option("--log-every", o.log_every, "steps between progress lines")
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", o.threads, "OpenBLAS threads")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    fmt::print(stderr, "fashion_mnist: error: {}\n", e.what());
    return 1;
  }
}
