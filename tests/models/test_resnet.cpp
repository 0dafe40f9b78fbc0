// ResNet-18 for 32x32 inputs (the GPU benchmark's compute-bound model): the
// parameter count, torchvision's names, the output shape, and that one
// backward reaches every parameter.
#include <catch2/catch.hpp>

#include <cmath>

#include "lockstep/models/models.h"
#include "lockstep/runtime/ops.h"
#include "support/test_util.h"

using namespace lockstep::nn;
using namespace lockstep::testing;
namespace models = lockstep::models;

namespace {

Tensor cifar_images(int64_t n, uint64_t seed) {
  Generator g(seed);
  return lockstep::runtime::randn({n, 3, 32, 32}, DType::f32, g);
}

}  // namespace

TEST_CASE("resnet18_cifar: parameter count and torchvision's names", "[nn][models][resnet]") {
  auto net = models::resnet18_cifar(0);
  CHECK(net->num_parameters() == 11'173'962);

  const StateDict sd = net->state_dict();
  const std::vector<std::string> keys = sd.keys();
  REQUIRE(keys.size() >= 3);
  CHECK(keys.front() == "conv1.weight");
  CHECK(keys[1] == "bn1.weight");
  CHECK(keys[keys.size() - 2] == "fc.weight");
  CHECK(keys.back() == "fc.bias");
  for (const char* name :
       {"layer1.0.conv1.weight", "layer1.1.bn2.running_var", "layer2.0.downsample.0.weight",
        "layer2.0.downsample.1.num_batches_tracked", "layer3.1.conv2.weight",
        "layer4.0.downsample.1.bias"}) {
    INFO(name);
    CHECK(sd.contains(name));
  }
  // Identity shortcuts where neither the stride nor the width changes; convs
  // have no bias (the batch norm after them has one).
  CHECK_FALSE(sd.contains("layer1.0.downsample.0.weight"));
  CHECK_FALSE(sd.contains("layer2.1.downsample.0.weight"));
  CHECK_FALSE(sd.contains("conv1.bias"));
  CHECK(sd.at("layer4.1.conv2.weight").shape() == Shape{512, 512, 3, 3});
  CHECK(sd.at("fc.weight").shape() == Shape{10, 512});
}

TEST_CASE("resnet18_cifar: [N, 3, 32, 32] -> [N, 10], and backward reaches every parameter",
          "[nn][models][resnet]") {
  auto net = models::resnet18_cifar(1);
  const Tensor x = cifar_images(2, 7);
  Tensor logits = (*net)(x);
  REQUIRE(logits.shape() == Shape{2, 10});

  Tensor loss = lockstep::runtime::cross_entropy(logits, Tensor::from_vector<int64_t>({3, 8}, {2}));
  loss.backward();
  for (const auto& [name, p] : net->named_parameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
    CHECK(p.grad().shape() == p.shape());
    bool finite = true;
    for (double v : values(p.grad())) finite = finite && std::isfinite(v);
    CHECK(finite);
  }

  net->eval();
  CHECK((*net)(cifar_images(3, 8)).shape() == Shape{3, 10});
}

TEST_CASE("resnet18_cifar is seeded: same seed, same parameters", "[nn][models][resnet]") {
  auto a = models::resnet18_cifar(4), b = models::resnet18_cifar(4), c = models::resnet18_cifar(5);
  auto pa = a->parameters(), pb = b->parameters(), pc = c->parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) CHECK(bitwise_equal(pa[i], pb[i]));
  CHECK_FALSE(bitwise_equal(pa[0], pc[0]));
}

TEST_CASE("resnet18_cifar loads weights without num_batches_tracked, as PyTorch does",
          "[nn][models][resnet][state_dict]") {
  // PyTorch before 0.4.1 saved no num_batches_tracked; PyTorch loads such a
  // state_dict strictly and keeps each BatchNorm's own count.
  auto source = models::resnet18_cifar(4), net = models::resnet18_cifar(5);
  net->train();
  (*net)(cifar_images(2, 9));
  StateDict old;
  for (const auto& [name, t] : source->state_dict())
    if (!name.ends_with(".num_batches_tracked")) old.insert(name, t);
  const LoadResult r = net->load_state_dict(old);
  CHECK(r.missing_keys.empty());
  CHECK(values(net->bn1->running_mean) == values(source->bn1->running_mean));
  CHECK(net->bn1->num_batches_tracked.item() == 1);
  CHECK(net->layers[3]->at<models::BasicBlock>(1)->bn2->num_batches_tracked.item() == 1);

  // Every other buffer is still required.
  old.erase("bn1.running_var");
  CHECK_THAT(error_of([&] { net->load_state_dict(old); }),
             Catch::Contains("missing key(s) in state_dict: \"bn1.running_var\"\n"));
}

TEST_CASE("resnet18_cifar with conv1 replaced for grey images takes [N, 1, H, W]",
          "[nn][models][resnet]") {
  // PyTorch's idiom for one-channel images: model.conv1 = nn.Conv2d(1, 64, ...).
  auto net = models::resnet18_cifar(2);
  Generator g(3);
  net->replace_child("conv1",
                     std::make_shared<Conv2d>(1, 64, 3, Conv2dOptions{.padding = 1, .bias = false},
                                              g));
  const Tensor grey = lockstep::runtime::randn({2, 1, 28, 28}, DType::f32, g);
  CHECK((*net)(grey).shape() == Shape{2, 10});
  // The message names the channels conv1 takes now.
  CHECK_THAT(error_of([&] { (*net)(cifar_images(2, 4)); }),
             Catch::Contains("expected input [N, 1, H, W]") &&
                 Catch::Contains("got [2, 3, 32, 32]"));
}
