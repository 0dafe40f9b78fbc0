// ResNet-18 (models/resnet.h) against PyTorch 1.13 running torchvision's
// module tree (BasicBlock, downsample) with the same 3x3 stem: the numbers
// below are printed by tests/nn/reference/make_resnet_reference.py, which
// fills both models alike from sine formulas (fill_like_reference, here and
// there). Checked: train-mode logits (batch statistics), the cross-entropy and
// gradients of one backward, the running statistics that forward updated with
// momentum 0.1 and its num_batches_tracked, then eval-mode logits from them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "lockstep/models/models.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/ops.h"
#include "support/test_util.h"

using namespace lockstep::nn;
using namespace lockstep::testing;
namespace models = lockstep::models;
namespace lr = lockstep::runtime;

namespace {

// make_resnet_reference.py's fill(): entry j of the p-th state_dict tensor.
void fill_like_reference(Module& m) {
  lr::NoGradGuard no_grad;
  int p = -1;
  for (const auto& [name, handle] : m.state_dict()) {
    ++p;
    if (name.ends_with("num_batches_tracked")) continue;
    Tensor t = handle;
    const double fan_in = t.dim() >= 2 ? static_cast<double>(t.numel() / t.size(0)) : 1.0;
    std::vector<float> v(static_cast<size_t>(t.numel()));
    for (size_t j = 0; j < v.size(); ++j) {
      const double base = std::sin(0.7 * static_cast<double>(j) + 1.3 * p + 0.5);
      double x = (name.ends_with("weight") ? 1.0 : 0.0) + 0.2 * base;
      if (name.ends_with("running_var")) {
        x = 1.0 + 0.5 * base * base;
      } else if (name.ends_with("running_mean")) {
        x = 0.1 * base;
      } else if (t.dim() >= 2) {
        x = base / std::sqrt(fan_in);
      }
      v[j] = static_cast<float>(x);
    }
    t.copy_(Tensor::from_vector(v, t.shape()));
  }
}

Tensor reference_input(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n * 3 * 32 * 32));
  for (size_t j = 0; j < v.size(); ++j)
    v[j] = static_cast<float>(std::sin(0.37 * static_cast<double>(j) + 0.1));
  return Tensor::from_vector(v, {n, 3, 32, 32});
}

// Each value within f32 rounding of PyTorch's, relative to the largest.
void check_all_close(const std::vector<double>& ours, const std::vector<double>& torch) {
  REQUIRE(ours.size() == torch.size());
  double scale = 0;
  for (double v : torch) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < ours.size(); ++i) {
    INFO("value " << i << ": " << ours[i] << " vs PyTorch's " << torch[i]);
    CHECK(std::fabs(ours[i] - torch[i]) <= 1e-4 * scale);
  }
}

}  // namespace

TEST_CASE("resnet18_cifar: train and eval outputs, gradients and BatchNorm statistics match "
          "PyTorch's",
          "[nn][models][resnet]") {
  auto net = models::resnet18_cifar(0);
  fill_like_reference(*net);
  const Tensor x = reference_input(2);

  net->train();
  const Tensor logits = (*net)(x);
  const Tensor loss = lr::cross_entropy(logits, Tensor::from_vector<int64_t>({3, 8}, {2}));
  loss.backward();
  check_all_close(values(logits),
                  {-0.326096117, 0.0601426214, 0.362519741, 0.571934104, 0.717856705,
                   0.845970929,  0.989093542,  1.14556038,  1.27564681,  1.3180033,
                   -0.320741177, 0.0821212754, 0.399662226, 0.621773541, 0.77708286,
                   0.910649836,  1.05492961,   1.20818067,  1.33089221,  1.36220431});
  CHECK(loss.item() == Approx(2.18930459).epsilon(1e-5));

  // Per parameter: sum |g| and sum g_j sin(0.3 j), the second within 1e-4 of the first.
  const std::vector<std::tuple<const char*, double, double>> grads = {
      {"conv1.weight", 734.040164, 12.3867201},
      {"bn1.weight", 1.62897862, 0.402518253},
      {"layer2.0.downsample.0.weight", 235.952834, -1.37910468},
      {"layer4.1.bn2.bias", 0.766061349, -0.000401688956},
      {"fc.weight", 630.869313, 3.24078318},
      {"fc.bias", 1.52442862, -0.013087297}};
  const auto params = net->named_parameters();
  for (const auto& [name, abs_sum, weighted] : grads) {
    INFO(name);
    const auto it = std::find_if(params.begin(), params.end(),
                                 [&](const auto& p) { return p.first == name; });
    REQUIRE(it != params.end());
    const std::vector<double> g = values(it->second.grad());
    double a = 0, w = 0;
    for (size_t j = 0; j < g.size(); ++j) {
      a += std::fabs(g[j]);
      w += g[j] * std::sin(0.3 * static_cast<double>(j));
    }
    CHECK(a == Approx(abs_sum).epsilon(1e-4));
    CHECK(std::fabs(w - weighted) <= 1e-4 * abs_sum);
  }

  // Running statistics after one batch: 0.9 * the filled values + 0.1 * the
  // batch's (the variance unbiased); first two entries and the sum.
  const StateDict sd = net->state_dict();
  const std::vector<std::pair<const char*, std::vector<double>>> stats = {
      {"bn1.running_mean", {-0.0856956095, -0.0833733752, -0.0999544566}},
      {"bn1.running_var", {1.03813469, 0.907749593, 71.9305625}},
      {"layer2.0.downsample.1.running_mean", {0.00707951188, -0.073169522, -0.0625521997}},
      {"layer4.1.bn2.running_var", {0.966095626, 1.23253679, 628.558287}}};
  for (const auto& [name, expected] : stats) {
    INFO(name);
    const std::vector<double> v = values(sd.at(name));
    double sum = 0;
    for (double e : v) sum += e;
    CHECK(v[0] == Approx(expected[0]).margin(1e-5));
    CHECK(v[1] == Approx(expected[1]).margin(1e-5));
    CHECK(sum == Approx(expected[2]).epsilon(1e-5).margin(1e-4));
  }
  for (const auto& [name, t] : sd) {
    if (!name.ends_with("num_batches_tracked")) continue;
    INFO(name);
    CHECK(t.item() == 1);
  }

  net->eval();
  lr::NoGradGuard no_grad;
  check_all_close(values((*net)(x)),
                  {22.0629654, 27.3405228, 30.7222843, 31.9946175, 31.1163902,
                   28.2013168, 23.4843369, 17.2865887, 9.99038982, 2.02763462,
                   21.8702469, 27.2337952, 30.7086391, 32.074955,  31.2853832,
                   28.4477406, 23.7918167, 17.6347065, 10.3560238, 2.38649893});
}
