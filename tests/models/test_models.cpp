// The Fashion-MNIST example models: shapes, parameter counts, PyTorch names,
// seeding, and that a few SGD steps on one batch lower the loss.
#include <catch2/catch.hpp>

#include "lockstep/models/models.h"
#include "lockstep/nn/nn.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/runtime/ops.h"
#include "support/test_util.h"

using namespace lockstep::nn;
using namespace lockstep::testing;
namespace models = lockstep::models;

namespace {

Tensor images(int64_t n, uint64_t seed) {
  Generator g(seed);
  return lockstep::runtime::rand({n, 1, 28, 28}, DType::f32, g);
}

Tensor labels(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = (i * 7) % 10;
  return Tensor::from_vector(v, {n});
}

// A few SGD steps on one fixed batch of 16 must lower the loss. (The
// inputs are not normalised, so lr 0.05 would overshoot on the CNN here.)
void check_learns(Module& model) {
  lockstep::optim::SGD opt(model.parameters(), {.lr = 0.02, .momentum = 0.9});
  CrossEntropyLoss loss_fn;
  const Tensor x = images(16, 3);
  const Tensor y = labels(16);
  double first = 0, last = 0;
  for (int step = 0; step < 8; ++step) {
    opt.zero_grad();
    Tensor loss = loss_fn(model(x), y);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item();
  }
  CHECK(last < first);
}

}  // namespace

TEST_CASE("fashion_mlp: shape, parameter count and PyTorch names", "[nn][models]") {
  auto mlp = models::fashion_mlp(0);
  CHECK(mlp->num_parameters() == 1'863'690);
  CHECK(mlp->state_dict().keys() == std::vector<std::string>{"1.weight", "1.bias", "3.weight",
                                                             "3.bias", "5.weight", "5.bias"});
  CHECK((*mlp)(images(4, 1)).shape() == Shape{4, 10});
  CHECK((*mlp)(images(4, 1).reshape({4, 784})).shape() == Shape{4, 10});
  check_learns(*mlp);
}

TEST_CASE("fashion_cnn: shape, parameter count and PyTorch names", "[nn][models]") {
  auto cnn = models::fashion_cnn(0);
  // conv1 320, bn1 64, conv2 18,496, bn2 128, fc1 401,536, fc2 1,290.
  CHECK(cnn->num_parameters() == 421'834);
  CHECK(cnn->state_dict().keys() ==
        std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                                 "1.running_var", "1.num_batches_tracked", "4.weight", "4.bias",
                                 "5.weight", "5.bias", "5.running_mean", "5.running_var",
                                 "5.num_batches_tracked", "9.weight", "9.bias", "11.weight",
                                 "11.bias"});
  CHECK((*cnn)(images(3, 1)).shape() == Shape{3, 10});
  cnn->eval();
  CHECK((*cnn)(images(2, 1)).shape() == Shape{2, 10});
  cnn->train();
  check_learns(*cnn);
}

TEST_CASE("the models are seeded: same seed, same parameters", "[nn][models]") {
  auto a = models::fashion_cnn(5), b = models::fashion_cnn(5), c = models::fashion_cnn(6);
  auto pa = a->parameters(), pb = b->parameters(), pc = c->parameters();
  for (size_t i = 0; i < pa.size(); ++i) CHECK(bitwise_equal(pa[i], pb[i]));
  CHECK_FALSE(bitwise_equal(pa[0], pc[0]));

  Generator g1(9), g2(9);
  CHECK(bitwise_equal(models::fashion_mlp(g1)->parameters()[0],
                      models::fashion_mlp(g2)->parameters()[0]));
}
