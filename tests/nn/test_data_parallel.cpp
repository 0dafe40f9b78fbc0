// nn::DataParallel on CPU replicas: PyTorch's semantics, each against one
// device doing the same work.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "lockstep/models/models.h"
#include "lockstep/nn/data_parallel.h"
#include "lockstep/nn/nn.h"
#include "lockstep/nn/sync_batch_norm.h"
#include "lockstep/nn/normalization.h"
#include "lockstep/runtime/autograd/checkpoint.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/replica_draws.h"
#include "nn/ddp/ddp_fixture.h"
#include "support/test_util.h"
#include "support/tied_model.h"

namespace lt = lockstep::testing;
namespace nn = lockstep::nn;
namespace lr = lockstep::runtime;
namespace models = lockstep::models;
using lockstep::runtime::Device;
using lockstep::runtime::Tensor;

namespace {

std::vector<Device> cpus(int n) { return std::vector<Device>(static_cast<size_t>(n), Device::cpu()); }

// "" when every parameter's gradient of `a` is within tol of `b`'s.
std::string grad_mismatch(nn::Module& a, nn::Module& b, double tol = 1e-5) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  if (pa.size() != pb.size()) return "parameter counts differ";
  for (size_t i = 0; i < pa.size(); ++i) {
    if (!pa[i].second.grad().defined()) return pa[i].first + ": no gradient";
    if (auto m = lt::mismatch(pa[i].first, pa[i].second.grad(), pb[i].second.grad(), tol); !m.empty())
      return m;
  }
  return "";
}

// Fashion-MNIST-shaped images, seeded.
Tensor images(int64_t n, uint64_t seed) {
  lr::Generator g(seed);
  return lr::randn({n, 1, 28, 28}, lr::DType::f32, g);
}

Tensor labels(int64_t n) {
  std::vector<int64_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) y[static_cast<size_t>(i)] = (i * 3) % 10;
  return Tensor::from_vector(y, {n});
}

// A module of this test's own, without replicate().
class Custom : public nn::Module {
 public:
  Tensor forward(const Tensor& x) override { return x; }
  std::string type_name() const override { return "Custom"; }
};

}  // namespace

TEST_CASE("DataParallel: the gradient equals one device's on the whole batch, even and uneven "
          "splits and a batch smaller than the devices",
          "[data_parallel]") {
  for (const auto& [devices, rows] : std::vector<std::pair<int, int64_t>>{{2, 16}, {3, 10}, {4, 2}}) {
    INFO(devices << " devices, batch " << rows);
    const auto batch = lt::global_batch(rows, 4);
    auto model = lt::small_mlp(9);
    nn::DataParallel dp(model, cpus(devices));
    Tensor out = dp.forward(batch.x);
    CHECK(out.shape() == lr::Shape{rows, 5});
    lr::cross_entropy(out, batch.y).backward();

    auto alone = lt::small_mlp(9);
    lt::loss_of(*alone, batch).backward();
    CHECK(grad_mismatch(*model, *alone) == "");
  }
}

TEST_CASE("DataParallel: a CNN with BatchNorm gets the gradient of one device running the same "
          "chunks; in eval mode, of the whole batch",
          "[data_parallel]") {
  const Tensor x = images(10, 1), y = labels(10);
  auto model = models::fashion_cnn(3);
  nn::DataParallel dp(model, cpus(2));
  lr::cross_entropy(dp.forward(x), y).backward();
  // Training mode: each replica normalises with its own chunk's statistics.
  auto alone = models::fashion_cnn(3);
  auto* first_bn = dynamic_cast<nn::BatchNorm2d*>((*alone)[1].get());
  REQUIRE(first_bn != nullptr);
  const Tensor first = alone->forward(x.slice(0, 0, 5));
  const Tensor running_after_first = first_bn->running_mean.clone();
  const Tensor second = alone->forward(x.slice(0, 5, 10));
  lr::cross_entropy(lr::cat({first, second}, 0), y).backward();
  CHECK(grad_mismatch(*model, *alone, 1e-4) == "");
  // Only the first chunk's update of the running statistics persists.
  auto* dp_bn = dynamic_cast<nn::BatchNorm2d*>((*model)[1].get());
  CHECK(lt::bitwise_equal(dp_bn->running_mean, running_after_first));

  // Eval mode: the running statistics (the same on both sides), so the whole
  // batch's gradient.
  alone->load_state_dict(model->state_dict());
  model->zero_grad();
  alone->zero_grad();
  dp.eval();
  alone->eval();
  lr::cross_entropy(dp.forward(x), y).backward();
  lt::loss_of(*alone, {x, y}).backward();
  CHECK(grad_mismatch(*model, *alone, 1e-4) == "");
}

TEST_CASE("DataParallel: the replicas take the wrapped module's mode, not the wrapper's "
          "(model->eval() without dp.eval())",
          "[data_parallel]") {
  const Tensor x = images(10, 4), y = labels(10);
  auto model = models::fashion_cnn(3);
  model->eval();  // the wrapper itself stays in training mode
  nn::DataParallel dp(model, cpus(2));
  REQUIRE(dp.is_training());
  lr::cross_entropy(dp.forward(x), y).backward();
  auto alone = models::fashion_cnn(3);
  alone->eval();
  lt::loss_of(*alone, {x, y}).backward();
  CHECK(grad_mismatch(*model, *alone, 1e-4) == "");

  // A submodule frozen in eval inside a training model stays frozen in the replicas.
  auto frozen = models::fashion_cnn(3);
  (*frozen)[1]->eval();
  nn::DataParallel dp2(frozen, cpus(2));
  const Tensor out = dp2.forward(x);
  auto reference = models::fashion_cnn(3);
  (*reference)[1]->eval();
  const Tensor first = reference->forward(x.slice(0, 0, 5));
  const Tensor second = reference->forward(x.slice(0, 5, 10));
  CHECK(lt::mismatch("output", out, lr::cat({first, second}, 0), 1e-5) == "");
}

TEST_CASE("DataParallel: dp.eval() reaches the replicas' BatchNorm, which normalises with the "
          "running statistics and leaves them as they are",
          "[data_parallel]") {
  const Tensor x = lt::global_batch(10, 7).x;
  auto bn = std::make_shared<nn::BatchNorm1d>(12);
  nn::DataParallel dp(bn, cpus(2));
  (void)dp.forward(x);  // training: the first replica's chunk updates the statistics
  const Tensor mean = bn->running_mean.clone(), var = bn->running_var.clone();
  dp.eval();
  REQUIRE_FALSE(bn->is_training());
  const Tensor out = dp.forward(x);
  CHECK(lt::mismatch("output", out, bn->forward(x), 1e-6) == "");
  CHECK(lt::mismatch("running_mean", bn->running_mean, mean, 0) == "");
  CHECK(lt::mismatch("running_var", bn->running_var, var, 0) == "");
  CHECK(bn->num_batches_tracked.item() == 1);
}

TEST_CASE("DataParallel: BatchNorm's running mean is the first half's (the forum's example)",
          "[data_parallel]") {
  // BatchNorm2d(3, momentum=1.0); the first half of the batch has mean 7 and
  // standard deviation 12, the second mean -9 and standard deviation 5.
  lr::Generator g(11);
  const Tensor first = lr::randn({8, 3, 4, 4}, lr::DType::f32, g) * 12.0 + 7.0;
  const Tensor second = lr::randn({8, 3, 4, 4}, lr::DType::f32, g) * 5.0 - 9.0;
  auto bn = std::make_shared<nn::BatchNorm2d>(3, nn::BatchNormOptions{.momentum = 1.0});
  nn::DataParallel dp(bn, cpus(2));
  dp.forward(lr::cat({first, second}, 0));
  nn::BatchNorm2d alone(3, {.momentum = 1.0});
  alone.forward(first);
  CHECK(lt::bitwise_equal(bn->running_mean, alone.running_mean));
  for (double m : lt::values(bn->running_mean)) CHECK(m == Approx(7.0).margin(3.0));
}

TEST_CASE("DataParallel: a parameter changed by hand reaches every replica at the next forward",
          "[data_parallel]") {
  const auto batch = lt::global_batch(12, 2);
  auto model = lt::small_mlp(5);
  nn::DataParallel dp(model, cpus(3));
  dp.forward(batch.x);
  {
    lr::NoGradGuard no_grad;
    model->parameters()[0].fill_(0.25);
  }
  const Tensor out = dp.forward(batch.x);
  auto alone = lt::small_mlp(5);
  {
    lr::NoGradGuard no_grad;
    alone->parameters()[0].fill_(0.25);
  }
  CHECK(lt::mismatch("output", out, alone->forward(batch.x), 1e-6) == "");
}

TEST_CASE("DataParallel: a wrapped submodule inside a larger model, gradients accumulated over "
          "two forwards, and PyTorch's state_dict names",
          "[data_parallel]") {
  const auto a = lt::global_batch(9, 6), b = lt::global_batch(9, 7);
  const auto make = [](uint64_t seed) {
    lr::Generator g(seed);
    auto body = std::make_shared<nn::Sequential>();
    body->push_back(std::make_shared<nn::Linear>(12, 16, true, g));
    body->push_back(std::make_shared<nn::ReLU>());
    auto head = std::make_shared<nn::Linear>(16, 5, true, g);
    return std::make_pair(body, head);
  };
  auto [body, head] = make(8);
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::DataParallel>(body, cpus(2)));
  model->push_back(head);
  auto [alone_body, alone_head] = make(8);
  auto alone = std::make_shared<nn::Sequential>();
  alone->push_back(alone_body);
  alone->push_back(alone_head);
  for (const auto* batch : {&a, &b}) {  // no zero_grad between: the gradients add up
    lt::loss_of(*model, *batch).backward();
    lt::loss_of(*alone, *batch).backward();
  }
  CHECK(grad_mismatch(*model, *alone) == "");
  const auto names = model->state_dict();
  CHECK(names.contains("0.module.0.weight"));
  CHECK(names.contains("1.bias"));
}

TEST_CASE("DataParallel: errors name what is wrong and what to do", "[data_parallel]") {
  CHECK_THROWS_WITH(nn::DataParallel(std::make_shared<Custom>(), cpus(2)).forward(Tensor::ones({4, 2})),
                    Catch::Contains("Custom: cannot be replicated for DataParallel"));
  CHECK_THROWS_WITH(nn::DataParallel(lt::small_mlp(1), {Device::cuda(0)}),
                    Catch::Contains("parameter '0.weight' is on cpu but devices[0] is cuda:0"));
  nn::DataParallel dp(lt::small_mlp(1), cpus(2));
  CHECK_THROWS_WITH(dp.forward(Tensor::ones({4, 7})),
                    Catch::Contains("DataParallel: replica ") && Catch::Contains("on cpu:"));
}

// An error of a caller's own kind, with a field of its own.
class RetryableError : public lockstep::Error {
 public:
  RetryableError(const std::string& what, int rows) : Error(what), rows(rows) {}
  int rows;
};

struct NotAStandardError {
  int code;
};

// Throws, in the chunk whose first element is negative, the error `kind` names.
class ThrowsOnNegative : public nn::Module {
 public:
  explicit ThrowsOnNegative(int kind) : kind(kind) {}
  Tensor forward(const Tensor& x) override {
    if (lt::values(x)[0] >= 0) return x;
    if (kind == 0) throw std::invalid_argument("negative input");
    if (kind == 1) throw RetryableError("too many rows", static_cast<int>(x.size(0)));
    throw NotAStandardError{7};
  }
  std::string type_name() const override { return "ThrowsOnNegative"; }
  std::shared_ptr<nn::Module> replicate() const override {
    return std::make_shared<ThrowsOnNegative>(kind);
  }
  const int kind;
};

TEST_CASE("DataParallel: a replica's exception reaches the caller as its own type, the replica "
          "named",
          "[data_parallel]") {
  // Rows 0-1 run on replica 0, rows 2-3 (negative) on replica 1.
  const Tensor x = Tensor::from_vector(std::vector<float>{1, 1, -1, -1}, {4, 1});
  nn::DataParallel invalid(std::make_shared<ThrowsOnNegative>(0), cpus(2));
  CHECK_THROWS_MATCHES(invalid.forward(x), std::invalid_argument,
                       Catch::Message("DataParallel: replica 1 on cpu: negative input"));
  nn::DataParallel retryable(std::make_shared<ThrowsOnNegative>(1), cpus(2));
  try {
    retryable.forward(x);
    FAIL("no exception");
  } catch (const RetryableError& e) {
    CHECK(e.rows == 2);
    CHECK(std::string(e.what()) == "DataParallel: replica 1 on cpu: too many rows");
  }
  nn::DataParallel other(std::make_shared<ThrowsOnNegative>(2), cpus(2));
  try {
    other.forward(x);
    FAIL("no exception");
  } catch (const NotAStandardError& e) {
    CHECK(e.code == 7);
  }
}

// A module whose replicate() registers its children in another order than
// the original. The replica's tensors are bound to the
// original's by position: before, its encoder silently read the decoder's
// weights, and the output of every chunk but the first was wrong.
class EncoderDecoder : public nn::Module {
 public:
  explicit EncoderDecoder(bool swapped = false) {
    lr::Generator g(3);
    auto first = std::make_shared<nn::Linear>(4, 4, true, g);
    auto second = std::make_shared<nn::Linear>(4, 4, true, g);
    if (swapped) {
      register_module("decoder", second, decoder);
      register_module("encoder", first, encoder);
    } else {
      register_module("encoder", first, encoder);
      register_module("decoder", second, decoder);
    }
  }
  Tensor forward(const Tensor& x) override {
    return decoder->forward(lr::relu(encoder->forward(x)));
  }
  std::string type_name() const override { return "EncoderDecoder"; }
  std::shared_ptr<nn::Module> replicate() const override {
    return std::make_shared<EncoderDecoder>(swap_in_replica);
  }
  bool swap_in_replica = true;
  std::shared_ptr<nn::Linear> encoder, decoder;
};

// Registers its own parameters in the order given: for the parameters' check.
class ScaleShift : public nn::Module {
 public:
  explicit ScaleShift(bool shift_first) {
    if (shift_first) shift = register_parameter("shift", Tensor::zeros({4}));
    scale = register_parameter("scale", Tensor::ones({4}));
    if (!shift_first) shift = register_parameter("shift", Tensor::zeros({4}));
  }
  Tensor forward(const Tensor& x) override { return lr::add(lr::mul(x, scale), shift); }
  std::string type_name() const override { return "ScaleShift"; }
  std::shared_ptr<nn::Module> replicate() const override {
    return std::make_shared<ScaleShift>(true);
  }
  Tensor scale, shift;
};

TEST_CASE("DataParallel: a replicate() that registers children or parameters in another order "
          "is named, not run with the tensors swapped",
          "[data_parallel]") {
  lr::Generator g(9);
  const Tensor x = lr::randn({4, 4}, lr::DType::f32, g);
  auto model = std::make_shared<EncoderDecoder>();
  CHECK_THROWS_WITH(nn::DataParallel(model, cpus(2)).forward(x),
                    Catch::Contains("EncoderDecoder::replicate() made a module whose submodule #1 "
                                    "is 'decoder', but the wrapped module's is 'encoder'"));
  auto scale_shift = std::make_shared<ScaleShift>(false);
  {
    lr::NoGradGuard no_grad;
    scale_shift->shift.fill_(1.0);
  }
  CHECK_THROWS_WITH(nn::DataParallel(scale_shift, cpus(2)).forward(x),
                    Catch::Contains("ScaleShift::replicate() made a module whose ScaleShift "
                                    "'(the root)' has 'shift' at position 0 of its parameters, "
                                    "where the wrapped module has 'scale'"));
  // Whatever the batch: one that fills a single chunk (a last batch of one
  // row, nn::Join's empty one) is refused too, not run on the wrapped module.
  CHECK_THROWS_WITH(nn::DataParallel(model, cpus(2)).forward(x.slice(0, 0, 1)),
                    Catch::Contains("submodule #1 is 'decoder'"));
  CHECK_THROWS_WITH(nn::DataParallel(model, cpus(2)).forward(x.slice(0, 0, 0)),
                    Catch::Contains("submodule #1 is 'decoder'"));
  CHECK_THROWS_WITH(nn::DataParallel(scale_shift, cpus(2)).forward(x.slice(0, 0, 1)),
                    Catch::Contains("has 'shift' at position 0 of its parameters"));
  // Built in the same order, it runs as the module alone does.
  model->swap_in_replica = false;
  const Tensor out = nn::DataParallel(model, cpus(2)).forward(x);
  CHECK(lt::mismatch("output", out, model->forward(x), 1e-6) == "");
}

// Returns, for a chunk whose first element is k, a [rows, k] output (or, with
// `per_row`, the per-row sums [rows]; with k = 0, a scalar).
class ShapeByInput : public nn::Module {
 public:
  explicit ShapeByInput(bool per_row) : per_row(per_row) {}
  Tensor forward(const Tensor& x) override {
    const auto k = static_cast<int64_t>(lt::values(x)[0]);
    if (per_row) return k == 0 ? lr::sum(x) : lr::sum(x, {1});
    return Tensor::ones({x.size(0), k});
  }
  std::string type_name() const override { return "ShapeByInput"; }
  std::shared_ptr<nn::Module> replicate() const override {
    return std::make_shared<ShapeByInput>(per_row);
  }
  const bool per_row;
};

// Outputs the gather cannot concatenate. Before, the error came from cat or
// reshape, of tensors the caller never passed, or called an output an input.
TEST_CASE("DataParallel: outputs that cannot be gathered are named as the replicas' outputs",
          "[data_parallel]") {
  nn::DataParallel ragged(std::make_shared<ShapeByInput>(false), cpus(2));
  CHECK_THROWS_WITH(ragged.forward(Tensor::from_vector<float>({2, 3}, {2, 1})),
                    Catch::Contains("DataParallel: output 0 has shape [1, 3] on replica 1 but "
                                    "[1, 2] on replica 0; the replicas' outputs are concatenated "
                                    "along dim 0"));
  nn::DataParallel scalar_or_not(std::make_shared<ShapeByInput>(true), cpus(2));
  CHECK_THROWS_WITH(scalar_or_not.forward(Tensor::from_vector<float>({0, 1}, {2, 1})),
                    Catch::Contains("output 0 has shape [1] on replica 1 but [] on replica 0"));
  // Split along dim 1, each replica returning one value per row: no dim 1 to gather along.
  nn::DataParallel by_columns(std::make_shared<ShapeByInput>(true), cpus(2), {.dim = 1});
  CHECK_THROWS_WITH(by_columns.forward(Tensor::ones({3, 4})),
                    Catch::Contains("DataParallel: dim 1 is out of range for output 0 of shape "
                                    "[3], along which the replicas' outputs are concatenated"));
}

// The empty batch nn::Join gives a rank whose data has run out: every layer
// must take it. Before, DataParallel refused it, so that rank left the Join
// loop with an error and the other ranks waited in its next collective.
TEST_CASE("DataParallel: an empty batch gives the module's empty output and zero gradients",
          "[data_parallel][join]") {
  auto model = lt::small_mlp(4);
  nn::DataParallel dp(model, cpus(3));
  const Tensor out = dp.forward(Tensor::empty({0, 12}));
  CHECK(out.shape() == lr::Shape{0, 5});
  lr::cross_entropy(out, Tensor::empty({0}, lr::DType::i64)).backward();
  for (const auto& [name, p] : model->named_parameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
    for (double v : lt::values(p.grad())) CHECK(v == 0.0);
  }
  // A loss per replica: one, of the one chunk, as for a batch of one row.
  nn::DataParallel loss(std::make_shared<nn::CrossEntropyLoss>(), cpus(2));
  const nn::Values losses =
      loss.forward_values({Tensor::empty({0, 5}), Tensor::empty({0}, lr::DType::i64)});
  CHECK(losses.tensor(0).shape() == lr::Shape{1});
}

TEST_CASE("DataParallel: backward gives the same bits every time, the replicas' parts run "
          "concurrently",
          "[data_parallel]") {
  const Tensor x = images(12, 5), y = labels(12);
  std::vector<Tensor> grads;
  for (int run = 0; run < 4; ++run) {
    auto model = models::fashion_cnn(2);
    nn::DataParallel dp(model, cpus(3));
    lr::cross_entropy(dp.forward(x), y).backward();
    grads.push_back(model->parameters()[0].grad());
  }
  for (size_t i = 1; i < grads.size(); ++i) CHECK(lt::bitwise_equal(grads[i], grads[0]));
}

// Two threads calling one DataParallel at once rebound and ran the same
// replicas (and made them at once on the first call): the process crashed.
TEST_CASE("DataParallel: called from two threads at once, each call gets the output of one "
          "device",
          "[data_parallel]") {
  const auto batch = lt::global_batch(12, 2);
  auto model = lt::small_mlp(5);
  nn::DataParallel dp(model, cpus(3));
  const Tensor expected = lt::small_mlp(5)->forward(batch.x);
  std::atomic<int> wrong{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 2; ++t) {
    callers.emplace_back([&] {
      for (int call = 0; call < 100; ++call) {
        if (!lt::mismatch("output", dp.forward(batch.x), expected, 1e-5).empty()) ++wrong;
      }
    });
  }
  for (auto& t : callers) t.join();
  CHECK(wrong == 0);
  // The gradients of both threads' last calls add up, as two calls on one thread.
  model->zero_grad();
  Tensor first, second;
  std::thread other([&] { first = dp.forward(batch.x); });
  second = dp.forward(batch.x);
  other.join();
  lr::add(lr::cross_entropy(first, batch.y), lr::cross_entropy(second, batch.y)).backward();
  auto alone = lt::small_mlp(5);
  lr::mul(lt::loss_of(*alone, batch), 2.0).backward();
  CHECK(grad_mismatch(*model, *alone) == "");
}

TEST_CASE("DataParallel: Dropout replicas draw disjoint numbers from the generator they share",
          "[data_parallel]") {
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Dropout>(0.5));
  nn::DataParallel dp(model, cpus(3));
  // Three identical chunks: the same mask in two of them would mean shared draws.
  const Tensor out = dp.forward(Tensor::ones({3, 256}));
  std::vector<std::vector<double>> masks;
  for (int64_t r = 0; r < 3; ++r) masks.push_back(lt::values(out.slice(0, r, r + 1)));
  CHECK(masks[0] != masks[1]);
  CHECK(masks[0] != masks[2]);
  CHECK(masks[1] != masks[2]);
}

// Replicas drawing from the default generator took the next draws as their
// threads reached it: the same seed gave other dropout masks from run to run.
TEST_CASE("DataParallel: after manual_seed, each replica's dropout masks are the same in every "
          "run, however the threads interleave",
          "[data_parallel]") {
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Dropout>(0.5));
  model->push_back(std::make_shared<nn::Dropout>(0.5));
  nn::DataParallel dp(model, cpus(4));
  const auto masks = [&] {
    lr::manual_seed(11);
    std::vector<double> all;
    for (int step = 0; step < 2; ++step) {
      const auto v = lt::values(dp.forward(Tensor::ones({4, 2048})));
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  const auto first = masks();
  for (int run = 0; run < 30; ++run) {
    INFO("run " << run);
    REQUIRE(masks() == first);
  }
}

// A batch of one row runs as one chunk: as the module alone, draws included.
TEST_CASE("DataParallel: a single chunk draws its dropout mask as the module alone does",
          "[data_parallel]") {
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Dropout>(0.5));
  nn::DataParallel dp(model, cpus(3));
  lr::manual_seed(4);
  const auto wrapped = lt::values(dp.forward(Tensor::ones({1, 512})));
  CHECK(lr::default_generator().offset() == 512);
  lr::manual_seed(4);
  CHECK(lt::values(model->forward(Tensor::ones({1, 512}))) == wrapped);
}

// Checkpointing inside a replica records the replica's own draws, so the
// recomputed masks are the forward's, and the forward's those of the same
// model without the checkpoint.
TEST_CASE("DataParallel: a checkpointed block with dropout gives the gradients of the same "
          "block without the checkpoint",
          "[data_parallel][checkpoint]") {
  const auto gradients = [](bool checkpointed) {
    lr::Generator init(5);
    auto block = std::make_shared<nn::Sequential>();
    block->push_back(std::make_shared<nn::Dropout>(0.5));
    block->push_back(std::make_shared<nn::Linear>(16, 16, true, init));
    auto model = std::make_shared<nn::Sequential>();
    model->push_back(std::make_shared<nn::Linear>(16, 16, true, init));
    if (checkpointed) model->push_back(std::make_shared<nn::Checkpoint>(block));
    else model->push_back(block);
    nn::DataParallel dp(model, cpus(3));
    lr::manual_seed(3);
    lr::Generator data(9);
    lr::sum(dp.forward(lr::randn({9, 16}, lr::DType::f32, data))).backward();
    std::vector<Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad());
    return grads;
  };
  const auto plain = gradients(false), checkpointed = gradients(true);
  REQUIRE(plain.size() == checkpointed.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    INFO("parameter " << i);
    CHECK(lt::mismatch("grad", checkpointed[i], plain[i], 1e-6).empty());
  }
}

TEST_CASE("DataParallel: a seeded Dropout's replicas draw from its generator, not a copy of it",
          "[data_parallel]") {
  const auto run = [] {
    auto model = std::make_shared<nn::Sequential>();
    auto drop = model->push_back(std::make_shared<nn::Dropout>(0.5, 7));
    nn::DataParallel dp(model, cpus(2));
    std::vector<std::vector<double>> rows;
    for (int step = 0; step < 3; ++step) {
      const Tensor out = dp.forward(Tensor::ones({2, 64}));
      const auto r0 = lt::values(out.slice(0, 0, 1)), r1 = lt::values(out.slice(0, 1, 2));
      INFO("step " << step);
      CHECK(r0 != r1);  // a copied generator gave both the same mask, at every step
      rows.push_back(r0);
      rows.push_back(r1);
    }
    // Both replicas' draws came out of the one seeded stream: a block each
    // per forward (runtime/replica_draws.h).
    CHECK(drop->generator->offset() == 3 * 2 * lr::ReplicaDrawBlocks::kBlock);
    return rows;
  };
  // Seeded: the same masks in every run, each replica its own.
  const auto a = run(), b = run();
  CHECK(a == b);
  // Reseeding the original reaches the replica.
  auto model = std::make_shared<nn::Sequential>();
  auto drop = model->push_back(std::make_shared<nn::Dropout>(0.5, 7));
  nn::DataParallel dp(model, cpus(2));
  dp.forward(Tensor::ones({2, 64}));
  drop->generator.emplace(7);
  dp.forward(Tensor::ones({2, 64}));
  CHECK(drop->generator->offset() == 2 * lr::ReplicaDrawBlocks::kBlock);
}

// A module whose forward makes a generator per layer: each is a new stream,
// even where the next is made at the address of the one before. Before, the
// replica kept drawing from the region taken for the first one (regions were
// found by the generator's address), so the second layer's mask was not its
// generator's.
class LocalDropouts : public nn::Module {
 public:
  Tensor forward(const Tensor& x) override {
    Tensor y = x;
    for (uint64_t layer = 0; layer < 2; ++layer) {
      lr::Generator g(100 + layer);  // one object per layer, replica and call
      y = lr::dropout(y, 0.5, true, g);
    }
    return y;
  }
  std::string type_name() const override { return "LocalDropouts"; }
  std::shared_ptr<nn::Module> replicate() const override {
    return std::make_shared<LocalDropouts>();
  }
};

TEST_CASE("DataParallel: a generator made in the forward draws from its own stream, even at "
          "the address of one destroyed before",
          "[data_parallel]") {
  auto model = std::make_shared<LocalDropouts>();
  nn::DataParallel dp(model, cpus(2));
  const Tensor x = Tensor::ones({2, 256});
  const Tensor out = dp.forward(x);
  // Replica 0 draws the first block of each generator: what the module draws alone.
  CHECK(lt::values(out.slice(0, 0, 1)) == lt::values(model->forward(x.slice(0, 0, 1))));
  CHECK(lt::values(dp.forward(x)) == lt::values(out));
}

TEST_CASE("DataParallel: a module tree changed between calls is replicated again",
          "[data_parallel]") {
  auto s = std::make_shared<nn::Sequential>();
  s->push_back(std::make_shared<nn::ReLU>());
  nn::DataParallel dp(s, cpus(2));
  const Tensor x = Tensor::from_vector<double>({-1, -2}, {2, 1});
  CHECK(lt::values(dp.forward(x)) == std::vector<double>{0, 0});
  s->replace_child("0", std::make_shared<nn::Dropout>(0.0));
  CHECK(lt::values(dp.forward(x)) == std::vector<double>{-1, -2});
  // A child added deeper down, too.
  auto inner = std::make_shared<nn::Sequential>();
  s->push_back(inner);
  CHECK(lt::values(dp.forward(x)) == std::vector<double>{-1, -2});
  inner->push_back(std::make_shared<nn::ReLU>());
  CHECK(lt::values(dp.forward(x)) == std::vector<double>{0, 0});

  // A ResNet whose BatchNorms were converted after the first call: the
  // replica runs SyncBatchNorms too, and the gradients still equal one device's.
  auto resnet = models::resnet18_cifar(3);
  auto twin = models::resnet18_cifar(3);
  nn::DataParallel rdp(resnet, cpus(2));
  lr::Generator g(4);
  const Tensor images = lr::randn({4, 3, 32, 32}, lr::DType::f32, g);
  rdp.forward(images.slice(0, 0, 2));
  nn::convert_sync_batchnorm(resnet, nullptr);
  twin->load_state_dict(resnet->state_dict());
  const Tensor out = rdp.forward(images);
  lr::sum(out).backward();
  lr::add(lr::sum(twin->forward(images.slice(0, 0, 2))), lr::sum(twin->forward(images.slice(0, 2, 4))))
      .backward();
  CHECK(grad_mismatch(*resnet, *twin, 1e-4) == "");
}

// Adds its buffer "offset", when it has one, to the input; replicate() copies
// every buffer it has, those registered after construction too.
class OffsetByBuffer : public nn::Module {
 public:
  Tensor forward(const Tensor& x) override {
    for (const auto& [name, b] : named_buffers(false))
      if (name == "offset") return lr::add(x, b);
    return x;
  }
  std::string type_name() const override { return "OffsetByBuffer"; }
  std::shared_ptr<nn::Module> replicate() const override {
    auto copy = std::make_shared<OffsetByBuffer>();
    for (const auto& [name, b] : const_cast<OffsetByBuffer*>(this)->named_buffers(false))
      copy->register_buffer(name, b.clone());
    return copy;
  }
};

TEST_CASE("DataParallel: a buffer registered between calls reaches the replicas",
          "[data_parallel]") {
  auto model = std::make_shared<OffsetByBuffer>();
  nn::DataParallel dp(model, cpus(2));
  const Tensor x = Tensor::zeros({4, 2});
  CHECK(lt::values(dp.forward(x)) == std::vector<double>(8, 0.0));
  model->register_buffer("offset", Tensor::ones({2}));
  CHECK(lt::values(dp.forward(x)) == std::vector<double>(8, 1.0));
}

TEST_CASE("DataParallel: a scalar output is gathered into a vector, one chunk or several",
          "[data_parallel]") {
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Linear>(3, 1));
  model->push_back(std::make_shared<nn::Flatten>(0));
  struct Sum : nn::Module {
    Tensor forward(const Tensor& x) override { return lr::sum(x); }
    std::string type_name() const override { return "Sum"; }
    std::shared_ptr<nn::Module> replicate() const override { return std::make_shared<Sum>(); }
  };
  model->push_back(std::make_shared<Sum>());
  nn::DataParallel two(model, cpus(2));
  CHECK(two.forward(Tensor::ones({1, 3})).shape() == lr::Shape{1});  // PyTorch: [1]
  CHECK(two.forward(Tensor::ones({2, 3})).shape() == lr::Shape{2});
  CHECK(two.forward(Tensor::ones({3, 3})).shape() == lr::Shape{2});
  // One device: the module's output as it is (PyTorch calls the module directly).
  nn::DataParallel one(model, cpus(1));
  CHECK(one.forward(Tensor::ones({2, 3})).shape() == lr::Shape{});
}

TEST_CASE("DataParallel: a loss module takes {input, target} and gives one loss per replica",
          "[data_parallel][loss]") {
  auto ce = std::make_shared<nn::CrossEntropyLoss>();
  nn::DataParallel dp(ce, cpus(2));
  lr::Generator g(5);
  const Tensor logits = lr::randn({4, 3}, lr::DType::f32, g);
  const Tensor target = Tensor::from_vector<int64_t>({0, 2, 1, 1}, {4});
  const nn::Values out = dp.forward_values({logits, target});
  REQUIRE(out.size() == 1);
  REQUIRE(out.tensor(0).shape() == lr::Shape{2});
  CHECK(lt::mismatch("mean", lr::mean(out.tensor(0)), lr::cross_entropy(logits, target), 1e-6) == "");
}

TEST_CASE("DataParallel: a submodule registered twice is one module in the replica too",
          "[data_parallel]") {
  lr::Generator g(6);
  auto shared = std::make_shared<nn::Linear>(4, 4, true, g);
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(shared);
  model->push_back(std::make_shared<nn::ReLU>());
  model->push_back(shared);
  auto twin = std::make_shared<nn::Sequential>();
  auto twin_shared = std::make_shared<nn::Linear>(4, 4, true, g);
  twin->push_back(twin_shared);
  twin->push_back(std::make_shared<nn::ReLU>());
  twin->push_back(twin_shared);
  twin->load_state_dict(model->state_dict());

  nn::DataParallel dp(model, cpus(2));
  const Tensor x = lr::randn({4, 4}, lr::DType::f32, g);
  const Tensor out = dp.forward(x);
  const Tensor expected = twin->forward(x);
  CHECK(lt::mismatch("out", out, expected, 1e-6) == "");
  lr::sum(out).backward();
  lr::sum(expected).backward();
  CHECK(grad_mismatch(*model, *twin) == "");
}

TEST_CASE("DataParallel: a weight tied between two modules is one tensor in the replica too",
          "[data_parallel]") {
  // The output layer reads the embedding's weight, as GPT's lm_head.
  auto model = lockstep::testing::tied_embedding_model(9);
  auto twin = lockstep::testing::tied_embedding_model(9);
  REQUIRE(model->parameters().size() == 3);  // the tied weight once
  const Tensor ids = Tensor::from_vector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2}, {4, 3});
  nn::DataParallel dp(model, cpus(2));
  const Tensor out = dp.forward(ids);
  const Tensor expected = twin->forward(ids);
  CHECK(lt::mismatch("out", out, expected, 1e-6) == "");
  lr::sum(lr::mul(out, out)).backward();
  lr::sum(lr::mul(expected, expected)).backward();
  CHECK(grad_mismatch(*model, *twin) == "");

  // A GPT, whose lm_head reads transformer.wte's weight.
  models::GptConfig config{.vocab_size = 11, .block_size = 4, .n_layer = 1, .n_head = 2,
                           .n_embd = 8};
  lr::Generator g(3);
  auto gpt = std::make_shared<models::Gpt>(config, g);
  nn::DataParallel gdp(gpt, cpus(2));
  const Tensor tokens = Tensor::from_vector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  const Tensor logits = gdp.forward_values({tokens}).tensor(0);
  CHECK(lt::mismatch("logits", logits, gpt->forward(tokens), 1e-5) == "");
  // Untied by hand: GPT::replicate() ties them, which is named, not ignored.
  gpt->replace_child("lm_head", std::make_shared<nn::Linear>(8, 11, false, g));
  CHECK_THROWS_WITH(gdp.forward_values({tokens}),
                    Catch::Contains("'transformer.wte.weight' and 'lm_head.weight' are one "
                                    "tensor, but they are two in the wrapped module"));
}

// DataParallel inside a checkpointed function: the replicas' regions of the
// generator are recorded in the forward and replayed in the recomputation.
// Before, the forward also recorded the throwaway draws of making the replicas
// (so backward threw), and the recomputation took new regions, moving the
// generator in backward and giving replica 0 another dropout mask.
TEST_CASE("DataParallel inside a checkpointed function: the recomputation replays each "
          "replica's draws, the gradients are the plain run's bit for bit",
          "[data_parallel][checkpoint]") {
  const bool own_generator = GENERATE(false, true);
  INFO((own_generator ? "a seeded Dropout's generator" : "the default generator"));
  const auto run = [&](bool checkpointed, uint64_t& offset_after_forward,
                       uint64_t& offset_after_backward) {
    lr::Generator init(5);
    auto model = std::make_shared<nn::Sequential>();
    model->push_back(std::make_shared<nn::Linear>(16, 16, true, init));
    auto drop = own_generator ? std::make_shared<nn::Dropout>(0.5, 21)
                              : std::make_shared<nn::Dropout>(0.5);
    model->push_back(drop);
    model->push_back(std::make_shared<nn::Linear>(16, 16, true, init));
    nn::DataParallel dp(model, cpus(3));
    lr::manual_seed(3);
    lr::Generator data(9);
    const Tensor x = lr::randn({9, 16}, lr::DType::f32, data);
    lr::Generator& g = own_generator ? *drop->generator : lr::default_generator();
    const Tensor y = checkpointed
                         ? lr::checkpoint([&](const Tensor& in) { return dp.forward(in); }, x)
                         : dp.forward(x);
    offset_after_forward = g.offset();
    lr::sum(lr::mul(y, y)).backward();
    offset_after_backward = g.offset();
    std::vector<Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad());
    return grads;
  };
  uint64_t plain_forward = 0, plain_backward = 0, forward = 0, backward = 0;
  const auto plain = run(false, plain_forward, plain_backward);
  const auto checkpointed = run(true, forward, backward);
  CHECK(forward == plain_forward);
  CHECK(backward == forward);  // the recomputation does not move the generator
  REQUIRE(plain.size() == checkpointed.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    INFO("parameter " << i);
    CHECK(lt::bitwise_equal(checkpointed[i], plain[i]));
  }
}

// Two replicas, each with a generator of its own made in the forward, whose
// regions are taken in one order in the forward and in the other in the
// recomputation (as the threads' timing may make them). Before, the
// recomputation replayed the draws strictly in the forward's order and threw
// that a generator had been re-seeded.
struct DrawOrder {
  std::atomic<int> first{0};  // the replica that draws first
  std::atomic<bool> drawn{false};
};

class OrderedLocalDropout : public nn::Module {
 public:
  explicit OrderedLocalDropout(std::shared_ptr<DrawOrder> order) : order_(std::move(order)) {}
  Tensor forward(const Tensor& x) override {
    // The chunk says which replica this is: rows of 1 or of 2.
    const int replica = lt::values(x)[0] < 1.5 ? 0 : 1;
    if (replica != order_->first.load()) {
      while (!order_->drawn.load()) std::this_thread::yield();
    }
    struct Done {  // lets the other replica go on, even when this one throws
      DrawOrder* order;
      ~Done() {
        if (order) order->drawn.store(true);
      }
    } done{replica == order_->first.load() ? order_.get() : nullptr};
    lr::Generator g(100 + static_cast<uint64_t>(replica));
    return lr::dropout(x, 0.5, true, g);
  }
  std::string type_name() const override { return "OrderedLocalDropout"; }
  std::shared_ptr<nn::Module> replicate() const override {
    return std::make_shared<OrderedLocalDropout>(order_);
  }

 private:
  std::shared_ptr<DrawOrder> order_;
};

TEST_CASE("DataParallel inside a checkpointed function: replicas that take their generators' "
          "regions in another order in the recomputation get the forward's draws",
          "[data_parallel][checkpoint]") {
  auto order = std::make_shared<DrawOrder>();
  nn::DataParallel dp(std::make_shared<OrderedLocalDropout>(order), cpus(2));
  const Tensor rows = lr::cat({Tensor::zeros({1, 256}), Tensor::ones({1, 256})}, 0);
  Tensor w = Tensor::ones({1, 256}).requires_grad_(true);
  const Tensor y = lr::checkpoint([&](const Tensor& in) { return dp.forward(lr::add(rows, in)); },
                                  w);
  order->first = 1;  // the recomputation: replica 1 takes its region first
  order->drawn = false;
  lr::sum(y).backward();
  // w's element j reaches element j of both rows, each through its mask (kept: 2).
  const auto out = lt::values(y);
  std::vector<double> expected(256, 0.0);
  for (size_t j = 0; j < 256; ++j)
    expected[j] = (out[j] != 0 ? 2 : 0) + (out[256 + j] != 0 ? 2 : 0);
  CHECK(lt::values(w.grad()) == expected);
}
