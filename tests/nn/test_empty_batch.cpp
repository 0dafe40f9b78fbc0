// Every layer and loss of a training step on an empty batch (N = 0, the batch
// nn::Join gives a rank whose data has run out): an empty output, a finite
// loss, zero gradients for every parameter, running statistics untouched.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>

#include "lockstep/nn/nn.h"
#include "lockstep/runtime/ops.h"
#include "support/test_util.h"

using namespace lockstep::nn;
using namespace lockstep::testing;
using lockstep::runtime::DType;
using lockstep::runtime::Generator;

namespace {

// "" when every parameter has a defined gradient of its shape, all zeros.
std::string zero_gradients(Module& m) {
  for (const auto& [name, p] : m.named_parameters()) {
    const Tensor& g = p.grad();
    if (!g.defined()) return name + ": no gradient";
    if (g.shape() != p.shape()) return name + ": gradient of another shape";
    for (double v : values(g))
      if (v != 0.0) return fmt::format("{}: gradient element {} (not 0)", name, v);
  }
  return "";
}

// Forward `x` (N = 0) through `m` in training, a Mean cross-entropy on the
// (flattened) output, backward. Returns the loss.
Tensor step_on_empty(Module& m, const Tensor& x, int64_t classes) {
  m.train();
  Tensor out = m.forward(x);
  CHECK(out.size(0) == 0);
  Tensor logits = out.reshape({0, classes});
  Tensor loss = lockstep::runtime::cross_entropy(logits, Tensor::empty({0}, DType::i64));
  loss.backward();
  return loss;
}

}  // namespace

TEST_CASE("Empty batch: an MLP with BatchNorm1d and GELU gets zero gradients and a 0 loss",
          "[nn][join]") {
  Generator g(3);
  Sequential m;
  m.push_back(std::make_shared<Linear>(6, 8, true, g));
  m.push_back(std::make_shared<BatchNorm1d>(8));
  m.push_back(std::make_shared<ReLU>());
  m.push_back(std::make_shared<Linear>(8, 8, true, g));
  m.push_back(std::make_shared<GELU>());
  m.push_back(std::make_shared<Linear>(8, 4, false, g));
  Tensor loss = step_on_empty(m, Tensor::empty({0, 6}), 4);
  CHECK(loss.dim() == 0);
  CHECK(loss.item() == 0.0);  // defined as 0 (PyTorch: NaN)
  CHECK(zero_gradients(m) == "");
}

TEST_CASE("Empty batch: a CNN (conv, BatchNorm2d, pools, flatten) gets zero gradients",
          "[nn][join]") {
  Generator g(4);
  Sequential m;
  m.push_back(std::make_shared<Conv2d>(1, 4, 3, Conv2dOptions{.padding = 1}, g));
  m.push_back(std::make_shared<BatchNorm2d>(4));
  m.push_back(std::make_shared<ReLU>());
  m.push_back(std::make_shared<MaxPool2d>(2));
  m.push_back(std::make_shared<Conv2d>(4, 4, 3, Conv2dOptions{}, g));
  m.push_back(std::make_shared<AvgPool2d>(2));
  m.push_back(std::make_shared<AdaptiveAvgPool2d>(1));
  m.push_back(std::make_shared<Flatten>());
  m.push_back(std::make_shared<Linear>(4, 3, true, g));
  Tensor loss = step_on_empty(m, Tensor::empty({0, 1, 8, 8}), 3);
  CHECK(loss.item() == 0.0);
  CHECK(zero_gradients(m) == "");
}

TEST_CASE("Empty batch: LayerNorm and an MSE loss give zero gradients and a 0 loss",
          "[nn][join]") {
  Generator g(5);
  Sequential m;
  m.push_back(std::make_shared<Linear>(5, 6, true, g));
  m.push_back(std::make_shared<LayerNorm>(std::vector<int64_t>{6}));
  Tensor out = m.forward(Tensor::empty({0, 5}));
  Tensor loss = lockstep::runtime::mse_loss(out, Tensor::empty({0, 6}));
  CHECK(loss.item() == 0.0);
  loss.backward();
  CHECK(zero_gradients(m) == "");
}

TEST_CASE("Empty batch: BatchNorm in training leaves its running statistics and count alone",
          "[nn][join]") {
  BatchNorm1d bn(3, BatchNormOptions{.momentum = std::nullopt});
  bn.train();
  Generator g(6);
  bn.forward(lockstep::runtime::randn({4, 3}, DType::f32, g));
  const auto mean = values(bn.running_mean), var = values(bn.running_var);
  const double tracked = bn.num_batches_tracked.item();
  Tensor out = bn.forward(Tensor::empty({0, 3}));
  CHECK(out.shape() == lockstep::runtime::Shape{0, 3});
  CHECK(values(bn.running_mean) == mean);
  CHECK(values(bn.running_var) == var);
  CHECK(bn.num_batches_tracked.item() == tracked);
  // One value per channel is still an error; none is not.
  CHECK_THAT(error_of([&] { bn.forward(Tensor::empty({1, 3})); }),
             Catch::Contains("more than 1 value per channel"));
}

TEST_CASE("Empty batch: cross_entropy with Sum and None reductions, and a non-empty batch still "
          "averages",
          "[nn][join]") {
  Tensor logits = Tensor::empty({0, 4});
  logits.requires_grad_(true);
  const Tensor none = Tensor::empty({0}, DType::i64);
  CHECK(lockstep::runtime::cross_entropy(logits, none, 0.0, Reduction::Sum).item() == 0.0);
  CHECK(lockstep::runtime::cross_entropy(logits, none, 0.0, Reduction::None).shape() ==
        lockstep::runtime::Shape{0});
  Tensor loss = lockstep::runtime::cross_entropy(logits, none);
  loss.backward();
  CHECK(logits.grad().shape() == lockstep::runtime::Shape{0, 4});
  // The usual case is unchanged: the mean over two equal rows is one row's loss.
  Tensor two = Tensor::zeros({2, 4});
  CHECK(std::abs(lockstep::runtime::cross_entropy(two, Tensor::from_vector<int64_t>({1, 2}, {2}))
                     .item() -
                 std::log(4.0)) < 1e-6);
}
