// Started by lockstep-run or mpirun (tests/nn/ddp/test_ddp_multiprocess.cpp):
// checks DDP's promises in real processes and prints
// "ddp_worker rank R/N: OK (<checks> checks)", or the first failure and exits 1.
//
//  1. MLP and CNN: the averaged gradient equals the one-process gradient on
//     the concatenated batch (the CNN's BatchNorm in eval mode, so batch
//     statistics do not enter; SyncBatchNorm has its own worker).
//  2. 20 SGD steps: parameters bitwise identical on every rank.
//  3. BatchNorm buffers: rank 0's running statistics reach every rank.
//  4. broadcast_parameters() repairs a parameter changed on one rank.
//  5. no_sync() accumulation equals the large batch.
//  6. find_unused_parameters with a head used on rank 0 only; and a head
//     used under no_sync() on every rank, then on rank 0 only: every rank's
//     accumulated gradient is averaged (with and without
//     gradient_as_bucket_view), the same bits on every rank.
//  7. Communication hooks: fp16 and bf16 compression within their rounding,
//     and a user hook that sees every bucket.
//
// Flags: --backend NAME    instead of LOCKSTEP_BACKEND / the default
//        --mismatch-rank R  rank R builds a wider model: construction must
//                           fail on every rank, naming the parameter.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lockstep/collectives/init.h"
#include "lockstep/models/models.h"
#include "lockstep/nn/ddp/distributed_data_parallel.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/normalization.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/random.h"

namespace lc = lockstep::collectives;
namespace nn = lockstep::nn;
namespace models = lockstep::models;
namespace lr = lockstep::runtime;
using lr::Tensor;

namespace {

struct Flags {
  std::string backend;
  int mismatch_rank = -1;
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i], value = argv[i + 1];
    if (arg == "--backend") {
      f.backend = value;
    } else if (arg == "--mismatch-rank") {
      f.mismatch_rank = std::stoi(value);
    } else {
      throw lockstep::Error(fmt::format("ddp_worker: unknown flag {}", arg));
    }
  }
  return f;
}

struct Batch {
  Tensor x, y;
};

// The global batch of `rows` Fashion-MNIST-shaped samples; every process
// makes the same one.
Batch global_batch(int64_t rows, uint64_t seed) {
  lr::Generator g(seed);
  Tensor x = lr::randn({rows, 1, 28, 28}, lr::DType::f32, g);
  std::vector<int64_t> y(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) y[static_cast<size_t>(i)] = (i * 3 + 1) % 10;
  return {x, Tensor::from_vector(y, {rows})};
}

Batch shard(const Batch& b, int rank, int n) {
  const int64_t per = b.x.size(0) / n;
  return {b.x.slice(0, rank * per, (rank + 1) * per).contiguous(),
          b.y.slice(0, rank * per, (rank + 1) * per).contiguous()};
}

Tensor loss_of(nn::Module& m, const Batch& b) { return lr::cross_entropy(m.forward(b.x), b.y); }

class Checks {
 public:
  Checks(std::shared_ptr<lc::ProcessGroup> group) : group_(std::move(group)) {}
  int count() const { return count_; }

  // Gradients within `rel` of the reference, relative to the reference
  // tensor's largest magnitude (float sums in another order).
  void close(const std::string& what, const Tensor& got, const Tensor& want, double rel) {
    if (!got.defined() || !want.defined()) fail(what + ": a gradient is missing");
    const auto a = got.to_vector<double>(), b = want.to_vector<double>();
    double scale = 0;
    for (double v : b) scale = std::max(scale, std::abs(v));
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::abs(a[i] - b[i]) > rel * scale + 1e-12) {
        fail(fmt::format("{}[{}] = {}, expected {} (largest {})", what, i, a[i], b[i], scale));
      }
    }
    ++count_;
  }

  // The same bits on every rank: rank 0's values, broadcast, compared.
  void identical_across_ranks(const std::string& what, const std::vector<Tensor>& tensors) {
    for (size_t t = 0; t < tensors.size(); ++t) {
      Tensor mine = tensors[t].detach().contiguous().clone();
      Tensor root = mine.clone();
      group_->broadcast(root, {.root = 0})->wait();
      if (std::memcmp(mine.raw_data(), root.raw_data(), mine.numel() * mine.element_size()) != 0) {
        fail(fmt::format("{}: tensor {} differs from rank 0's", what, t));
      }
    }
    ++count_;
  }

  [[noreturn]] void fail(const std::string& why) { throw lockstep::Error("FAILED: " + why); }

 private:
  std::shared_ptr<lc::ProcessGroup> group_;
  int count_ = 0;
};

void check_gradients(Checks& c, const std::shared_ptr<lc::ProcessGroup>& group, const char* model) {
  const int r = group->rank(), n = group->size();
  const bool cnn = std::strcmp(model, "cnn") == 0;
  auto make = [&] { return cnn ? models::fashion_cnn(3) : models::fashion_mlp(3); };
  const Batch global = global_batch(4 * n, 11);
  auto reference = make();
  if (cnn) reference->eval();
  loss_of(*reference, global).backward();
  // Other ranks start from other weights: DDP copies rank 0's.
  auto local = cnn ? models::fashion_cnn(3 + r) : models::fashion_mlp(3 + r);
  nn::DistributedDataParallel ddp(local, group);
  if (cnn) ddp.eval();  // BatchNorm from running statistics (the gradient still flows)
  loss_of(ddp, shard(global, r, n)).backward();
  const auto mine = local->named_parameters(), want = reference->named_parameters();
  for (size_t i = 0; i < mine.size(); ++i) {
    c.close(fmt::format("{} {}.grad", model, mine[i].first), mine[i].second.grad(),
            want[i].second.grad(), 1e-5);
  }
}

void check_training_stays_identical(Checks& c, const std::shared_ptr<lc::ProcessGroup>& group) {
  const int r = group->rank(), n = group->size();
  auto model = models::fashion_cnn(5);
  nn::DistributedDataParallel ddp(model, group);
  lockstep::optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  for (int step = 0; step < 20; ++step) {
    const Batch local = shard(global_batch(2 * n, 100 + step), r, n);
    opt.zero_grad();
    loss_of(ddp, local).backward();
    opt.step();
  }
  c.identical_across_ranks("parameters after 20 steps", model->parameters());
}

void check_buffers_and_parameters(Checks& c, const std::shared_ptr<lc::ProcessGroup>& group) {
  const int r = group->rank();
  auto model = std::make_shared<nn::Sequential>();
  auto bn = model->push_back(std::make_shared<nn::BatchNorm1d>(4));
  nn::DistributedDataParallel ddp(model, group);
  {
    lr::NoGradGuard no_grad;
    bn->running_mean.fill_(static_cast<double>(r));  // each rank drifts its own way
    bn->weight.fill_(1.0 + r);                        // a parameter changed by hand
  }
  ddp.eval();
  ddp.train();
  // The next training forward copies rank 0's buffers first (then updates them
  // with this rank's batch: a zero batch keeps the mean at 0.9 * rank 0's 0).
  ddp.forward(Tensor::zeros({2, 4}));
  c.close("running_mean after forward", bn->running_mean, Tensor::zeros({4}), 0);
  ddp.broadcast_parameters();
  c.identical_across_ranks("weight after broadcast_parameters", {bn->weight});
}

void check_no_sync(Checks& c, const std::shared_ptr<lc::ProcessGroup>& group) {
  const int r = group->rank(), n = group->size();
  const Batch a = global_batch(2 * n, 31), b = global_batch(2 * n, 32);
  auto reference = models::fashion_mlp(7);
  lr::mul(loss_of(*reference, a), 0.5).backward();
  lr::mul(loss_of(*reference, b), 0.5).backward();
  auto model = models::fashion_mlp(7);
  nn::DistributedDataParallel ddp(model, group);
  {
    auto guard = ddp.no_sync();
    lr::mul(loss_of(ddp, shard(a, r, n)), 0.5).backward();
  }
  lr::mul(loss_of(ddp, shard(b, r, n)), 0.5).backward();
  const auto mine = model->parameters(), want = reference->parameters();
  for (size_t i = 0; i < mine.size(); ++i) c.close("no_sync grad", mine[i].grad(), want[i].grad(), 1e-5);
}

// Two heads; the second only on rank 0.
class TwoHeads : public nn::Module {
 public:
  TwoHeads() {
    lr::Generator g(9);
    body = register_module("body", models::fashion_mlp(g));
    head = register_module("head", std::make_shared<nn::Linear>(10, 10, true, g));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = body->forward(x);
    return use_head ? head->forward(h) : h;
  }
  std::shared_ptr<nn::Module> body;
  std::shared_ptr<nn::Linear> head;
  bool use_head = false;
};

void check_unused(Checks& c, const std::shared_ptr<lc::ProcessGroup>& group) {
  const int r = group->rank(), n = group->size();
  const Batch global = global_batch(2 * n, 41);
  auto model = std::make_shared<TwoHeads>();
  nn::DistributedDataParallel ddp(model, group, nn::DdpOptions{.find_unused_parameters = true});
  loss_of(ddp, shard(global, r, n)).backward();  // head unused everywhere
  if (model->head->weight.grad().defined()) c.fail("a head unused on every rank got a gradient");
  model->use_head = r == 0;
  ddp.zero_grad();
  loss_of(ddp, shard(global, r, n)).backward();
  auto alone = std::make_shared<TwoHeads>();
  alone->use_head = true;
  loss_of(*alone, shard(global, 0, n)).backward();
  c.close("head used on rank 0 only", model->head->weight.grad(),
          lr::mul(alone->head->weight.grad(), 1.0 / n), 1e-5);

  // Accumulated under no_sync() on every rank, reached on rank 0 only by the
  // averaged backward: (sum over ranks of the first shards' gradients + rank
  // 0's second one) / n, as one process accumulating them.
  const Batch second = global_batch(2 * n, 42);
  auto reference = std::make_shared<TwoHeads>();
  reference->use_head = true;
  for (int k = 0; k < n; ++k) loss_of(*reference, shard(global, k, n)).backward();
  loss_of(*reference, shard(second, 0, n)).backward();
  const Tensor want = lr::mul(reference->head->weight.grad(), 1.0 / n);
  for (bool view : {false, true}) {
    auto accumulating = std::make_shared<TwoHeads>();
    nn::DistributedDataParallel acc(
        accumulating, group,
        nn::DdpOptions{.find_unused_parameters = true, .gradient_as_bucket_view = view});
    accumulating->use_head = true;
    {
      auto guard = acc.no_sync();
      loss_of(acc, shard(global, r, n)).backward();
    }
    accumulating->use_head = r == 0;
    loss_of(acc, shard(second, r, n)).backward();
    const std::string what = fmt::format("head accumulated under no_sync, then used on rank 0 "
                                         "only (gradient_as_bucket_view {})", view);
    c.close(what, accumulating->head->weight.grad(), want, 1e-5);
    c.identical_across_ranks(what, {accumulating->head->weight.grad()});
  }
}

void check_hooks(Checks& c, const std::shared_ptr<lc::ProcessGroup>& group) {
  const int r = group->rank(), n = group->size();
  const Batch global = global_batch(2 * n, 51);
  auto reference = models::fashion_mlp(8);
  loss_of(*reference, global).backward();
  const auto want = reference->parameters();
  // Each rank's share is rounded once to the wire format, the sum once more:
  // about 2 ulps of f16 (2^-10) and bf16 (2^-7) relative to the largest value.
  const std::pair<const char*, double> formats[] = {{"fp16", 2e-3}, {"bf16", 1.6e-2}};
  for (const auto& [format, tol] : formats) {
    auto model = models::fashion_mlp(8);
    nn::DistributedDataParallel ddp(model, group);
    ddp.register_comm_hook(std::string(format) == "fp16" ? nn::comm_hooks::fp16_compress()
                                                         : nn::comm_hooks::bf16_compress());
    loss_of(ddp, shard(global, r, n)).backward();
    const auto mine = model->parameters();
    for (size_t i = 0; i < mine.size(); ++i) {
      c.close(fmt::format("{} hook grad {}", format, i), mine[i].grad(), want[i].grad(), tol);
    }
  }
  // A user hook: the default all-reduce, counting the buckets it was given.
  auto model = models::fashion_mlp(8);
  nn::DistributedDataParallel ddp(model, group, nn::DdpOptions{.bucket_cap_mb = 2});
  int buckets_seen = 0;
  ddp.register_comm_hook([&](nn::GradBucket& bucket) {
    ++buckets_seen;
    return nn::comm_hooks::allreduce()(bucket);
  });
  loss_of(ddp, shard(global, r, n)).backward();
  if (buckets_seen != static_cast<int>(ddp.buckets().size()) || buckets_seen < 2) {
    c.fail(fmt::format("the user hook saw {} buckets of {}", buckets_seen, ddp.buckets().size()));
  }
  const auto mine = model->parameters();
  for (size_t i = 0; i < mine.size(); ++i) c.close("user hook grad", mine[i].grad(), want[i].grad(), 1e-5);
}

}  // namespace

int main(int argc, char** argv) {
  std::string who = "ddp_worker";
  try {
    const Flags flags = parse(argc, argv);
    lc::InitOptions options;
    options.backend = flags.backend;
    auto group = lc::init_process_group(options);
    const int rank = group->rank();
    who = fmt::format("ddp_worker rank {}/{}", rank, group->size());
    std::printf("%s: backend %s\n", who.c_str(), group->backend().c_str());
    if (flags.mismatch_rank >= 0) {
      auto model = rank == flags.mismatch_rank ? models::fashion_mlp(1) : models::fashion_cnn(1);
      nn::DistributedDataParallel ddp(model, group);
      std::printf("%s: constructed DDP over different models\n", who.c_str());
      return 1;
    }
    Checks checks(group);
    check_gradients(checks, group, "mlp");
    check_gradients(checks, group, "cnn");
    check_training_stays_identical(checks, group);
    check_buffers_and_parameters(checks, group);
    check_no_sync(checks, group);
    check_unused(checks, group);
    check_hooks(checks, group);
    group->barrier({})->wait();
    std::printf("%s: OK (%d checks)\n", who.c_str(), checks.count());
    return 0;
  } catch (const std::exception& e) {
    std::printf("%s: %s\n", who.c_str(), e.what());
    std::fflush(stdout);
    return 1;
  }
}
