// The elementwise losses (binary_cross_entropy with and without logits, l1,
// smooth_l1, huber, kl_div): values against double-precision references written from
// PyTorch 1.13's definitions, gradients against finite differences or the
// closed form, and argument errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/pointwise_loss.h"
#include "lockstep/runtime/ops/reduce.h"
#include "lockstep/runtime/tensor.h"
#include "support/gradcheck.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

namespace {

double total(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

// log(sigmoid(x)) in double without overflow.
double log_sigmoid(double x) {
  return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x));
}

Tensor f64(const std::vector<double>& v, const Shape& s) {
  return Tensor::from_vector<double>(v, s);
}

}  // namespace

TEST_CASE("binary_cross_entropy_with_logits matches its definition, with weight and pos_weight",
          "[runtime][ops][loss]") {
  const DType dt = GENERATE(DType::f32, DType::f64);
  const bool weighted = GENERATE(false, true);
  const double tol = dt == DType::f32 ? 1e-5 : 1e-12;
  INFO("dtype " << dtype_name(dt) << ", weighted " << weighted);
  // [2, 3]: logits far out on both sides (where sigmoid rounds to 0 or 1).
  const std::vector<double> x = {100, -100, 0, 2.5, -30, 0.75};
  const std::vector<double> y = {0, 1, 0.5, 1, 0, 0.2};
  const std::vector<double> w = {0.5, 2, 1}, pw = {2, 3, 4};  // [3], per column
  std::vector<double> ref;
  for (size_t i = 0; i < x.size(); ++i) {
    const double p = weighted ? pw[i % 3] : 1, ww = weighted ? w[i % 3] : 1;
    ref.push_back(-ww * (p * y[i] * log_sigmoid(x[i]) + (1 - y[i]) * log_sigmoid(-x[i])));
  }
  BceWithLogitsOptions o;
  if (weighted) {
    o.weight = f64(w, {3}).to(dt);
    o.pos_weight = f64(pw, {3}).to(dt);
  }
  const Tensor input = f64(x, {2, 3}).to(dt), target = f64(y, {2, 3}).to(dt);
  o.reduction = Reduction::None;
  const Tensor none = binary_cross_entropy_with_logits(input, target, o);
  CHECK(none.shape() == Shape{2, 3});
  CHECK(none.dtype() == dt);
  check_close(none, ref, tol * 100);  // |loss| up to 300
  o.reduction = Reduction::Sum;
  CHECK(binary_cross_entropy_with_logits(input, target, o).item() ==
        Approx(total(ref)).epsilon(tol));
  o.reduction = Reduction::Mean;
  CHECK(binary_cross_entropy_with_logits(input, target, o).item() ==
        Approx(total(ref) / 6).epsilon(tol));
  if (!weighted)  // the default is Mean
    CHECK(binary_cross_entropy_with_logits(input, target).item() ==
          Approx(total(ref) / 6).epsilon(tol));
}

TEST_CASE("binary_cross_entropy_with_logits gradients match finite differences",
          "[runtime][ops][loss]") {
  const Tensor x = random_input({3, 4}, 1, -4, 4);
  const Tensor y = random_input({3, 4}, 2, 0, 1);
  const Tensor pw = random_input({4}, 3, 0.5, 3);
  const Tensor w = random_input({3, 1}, 4, 0.5, 2);
  auto r = gradcheck(
      [](const std::vector<Tensor>& in) {
        return binary_cross_entropy_with_logits(
            in[0], in[1], {.weight = in[3], .pos_weight = in[2], .reduction = Reduction::Sum});
      },
      {x, y, pw, w});
  INFO(r.message);
  CHECK(r.ok);
  // At 0 the gradient is sigmoid(0) - y = 0.5 - y, whichever side relu takes.
  Tensor z = Tensor::zeros({2}, DType::f64);
  z.requires_grad_();
  binary_cross_entropy_with_logits(z, f64({1, 0}, {2}), {.reduction = Reduction::Sum}).backward();
  check_close(z.grad(), {-0.5, 0.5}, 1e-15);
}

TEST_CASE("binary_cross_entropy matches PyTorch: logs clamped at -100, its gradient clamp",
          "[runtime][ops][loss]") {
  const DType dt = GENERATE(DType::f32, DType::f64);
  const double tol = dt == DType::f32 ? 1e-5 : 1e-12;
  INFO("dtype " << dtype_name(dt));
  const std::vector<double> x = {0, 1, 0.5, 0.9, 0.1, 1e-60};
  const std::vector<double> y = {1, 0, 0.3, 1, 0, 1};
  std::vector<double> ref;
  for (size_t i = 0; i < x.size(); ++i)
    ref.push_back(-(y[i] * std::max(std::log(x[i]), -100.0) +
                    (1 - y[i]) * std::max(std::log(1 - x[i]), -100.0)));
  Tensor input = f64(x, {6}).to(dt);
  input.requires_grad_();
  const Tensor target = f64(y, {6}).to(dt);
  const Tensor none = binary_cross_entropy(input, target, {.reduction = Reduction::None});
  check_close(none, ref, tol * 100);
  CHECK(binary_cross_entropy(input, target).item() == Approx(total(ref) / 6).epsilon(tol));
  binary_cross_entropy(input, target, {.reduction = Reduction::Sum}).backward();
  // (x - y) / max(x (1 - x), 1e-12): finite (±1e12) at exactly 0 and 1, as PyTorch.
  std::vector<double> expected;
  for (size_t i = 0; i < x.size(); ++i) {
    const double xi = static_cast<double>(values(input)[i]);
    expected.push_back((xi - y[i]) / std::max(xi * (1 - xi), 1e-12));
  }
  const auto g = values(input.grad());
  for (size_t i = 0; i < x.size(); ++i) CHECK(g[i] == Approx(expected[i]).epsilon(tol * 10));
  CHECK(g[0] == Approx(-1e12));
  CHECK(g[1] == Approx(1e12));
}

TEST_CASE("binary_cross_entropy keeps small losses: its clamp at -100 does not round the log",
          "[runtime][ops][loss]") {
  // A confident, right prediction: -log(1 - 1e-6) = 1e-6. Clamping by
  // relu(log x + 100) - 100 rounded log x to the f32 ulp of 100 (8e-6): 0.
  const DType dt = GENERATE(DType::f32, DType::bf16);
  INFO("dtype " << dtype_name(dt));
  const std::vector<double> x = {1 - 1e-6, 0.999, 0.25, 0.375};
  const std::vector<double> y = {1, 1, 1, 0};  // 1 - x exact for y = 0
  const Tensor input = f64(x, {4}).to(dt);
  const auto xs = values(input);  // as rounded to dt
  const auto l = values(binary_cross_entropy(input, f64(y, {4}).to(dt),
                                             {.reduction = Reduction::None}));
  const double tol = dt == DType::f32 ? 1e-5 : 1e-2;
  for (size_t i = 0; i < x.size(); ++i) {
    const double ref = y[i] == 1 ? -std::log(xs[i]) : -std::log(1 - xs[i]);
    INFO("x = " << xs[i]);
    CHECK(l[i] == Approx(ref).epsilon(tol));
  }
}

TEST_CASE("binary_cross_entropy gradients (input, target) match finite differences, weighted",
          "[runtime][ops][loss]") {
  const Tensor x = random_input({2, 3}, 5, 0.05, 0.95);
  const Tensor y = random_input({2, 3}, 6, 0, 1);
  const Tensor w = f64({0.5, 1, 3}, {3});
  auto r = gradcheck(
      [&](const std::vector<Tensor>& in) {
        return binary_cross_entropy(in[0], in[1], {.weight = w, .reduction = Reduction::Mean});
      },
      {x, y});
  INFO(r.message);
  CHECK(r.ok);
}

TEST_CASE("binary_cross_entropy gives a weight that requires grad its gradient, broadcast or not",
          "[runtime][ops][loss][gradcheck]") {
  // The weight used to be read as a constant: its gradient came back zero.
  const Tensor x = random_input({2, 3}, 7, 0.05, 0.95);
  const Tensor y = random_input({2, 3}, 8, 0, 1).detach();
  const Shape shape = GENERATE(Shape{2, 3}, Shape{3}, Shape{2, 1}, Shape{});
  const Reduction reduction = GENERATE(Reduction::Mean, Reduction::Sum, Reduction::None);
  INFO("weight " << shape_str(shape));
  const Tensor w = random_input(shape, 9, 0.5, 2.0);
  auto r = gradcheck(
      [&](const std::vector<Tensor>& in) {
        return binary_cross_entropy(in[0], y, {.weight = in[1], .reduction = reduction});
      },
      {x, w});
  INFO(r.message);
  CHECK(r.ok);
}

TEST_CASE("binary_cross_entropy refuses inputs outside [0, 1] as PyTorch does",
          "[runtime][ops][loss]") {
  const double bad = GENERATE(1.5, -0.25, std::numeric_limits<double>::quiet_NaN());
  INFO("input " << bad);
  const Tensor x = f64({0.5, bad}, {2}), y = f64({1, 0}, {2});
  CHECK_THROWS_WITH(binary_cross_entropy(x, y),
                    Contains("all elements of input should be between 0 and 1") &&
                        Contains("binary_cross_entropy_with_logits"));
}

TEST_CASE("the elementwise losses refuse mismatched shapes, dtypes and weights",
          "[runtime][ops][loss]") {
  const Tensor x = Tensor::full({2, 3}, 0.5), y1 = Tensor::full({2}, 0.5);
  CHECK_THROWS_WITH(binary_cross_entropy(x, y1), Contains("[2, 3]") && Contains("same shape"));
  CHECK_THROWS_WITH(binary_cross_entropy_with_logits(x, y1), Contains("same shape"));
  CHECK_THROWS_WITH(binary_cross_entropy_with_logits(x, x.to(DType::f64)),
                    Contains("one floating dtype"));
  CHECK_THROWS_WITH(l1_loss(x, y1), Contains("same shape"));
  CHECK_THROWS_WITH(smooth_l1_loss(x, y1), Contains("same shape"));
  CHECK_THROWS_WITH(huber_loss(x, y1), Contains("same shape"));
  CHECK_THROWS_WITH(l1_loss(x, x.to(DType::f64)), Contains("one floating dtype"));
  CHECK_THROWS_WITH(binary_cross_entropy_with_logits(x, x, {.pos_weight = Tensor::ones({2})}),
                    Contains("pos_weight [2] does not broadcast"));
  CHECK_THROWS_WITH(binary_cross_entropy(x, x, {.weight = Tensor::ones({3}, DType::f64)}),
                    Contains("weight (f64 on cpu) must be of the input's dtype"));
  CHECK_THROWS_WITH(smooth_l1_loss(x, x, Reduction::Mean, -1), Contains("beta must be >= 0"));
  CHECK_THROWS_WITH(huber_loss(x, x, Reduction::Mean, 0), Contains("delta must be > 0"));
}

TEST_CASE("the elementwise losses over no elements: Mean and Sum are 0, None is empty",
          "[runtime][ops][loss]") {
  const Tensor e = Tensor::empty({0, 3});
  for (Reduction r : {Reduction::Mean, Reduction::Sum}) {
    CHECK(binary_cross_entropy(e, e, {.reduction = r}).item() == 0);
    CHECK(binary_cross_entropy_with_logits(e, e, {.reduction = r}).item() == 0);
    CHECK(l1_loss(e, e, r).item() == 0);
    CHECK(smooth_l1_loss(e, e, r).item() == 0);
    CHECK(huber_loss(e, e, r).item() == 0);
  }
  CHECK(l1_loss(e, e, Reduction::None).shape() == Shape{0, 3});
}

TEST_CASE("l1, smooth_l1 and huber losses match their definitions and gradients",
          "[runtime][ops][loss]") {
  const double k = GENERATE(0.5, 1.0, 2.0);
  INFO("beta = delta = " << k);
  // Differences inside, outside and exactly on the border, and 0.
  const std::vector<double> x = {0.1, -3, 2, k, -k, 0, 0.4, 5};
  const std::vector<double> y = {0, 0, 1, 0, 0, 0, 0.9, -1};
  std::vector<double> l1, sl1, hub, g_l1, g_sl1, g_hub;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = x[i] - y[i], a = std::abs(d);
    const double sign = d > 0 ? 1 : d < 0 ? -1 : 0;
    l1.push_back(a);
    sl1.push_back(a < k ? 0.5 * d * d / k : a - 0.5 * k);
    hub.push_back(a <= k ? 0.5 * d * d : k * (a - 0.5 * k));
    // PyTorch's backward: d / beta inside, sign(d) outside; Huber is delta times that.
    g_l1.push_back(sign);
    g_sl1.push_back(a < k ? d / k : sign);
    g_hub.push_back(a < k ? d : k * sign);
  }
  const Tensor target = f64(y, {8});
  auto run = [&](auto f, const std::vector<double>& ref, const std::vector<double>& grad) {
    Tensor input = f64(x, {8});
    input.requires_grad_();
    check_close(f(input, Reduction::None), ref, 1e-12);
    CHECK(f(input, Reduction::Sum).item() == Approx(total(ref)));
    Tensor mean_loss = f(input, Reduction::Mean);
    CHECK(mean_loss.item() == Approx(total(ref) / 8));
    mean_loss.backward();
    std::vector<double> expected;
    for (double g : grad) expected.push_back(g / 8);
    check_close(input.grad(), expected, 1e-12);
  };
  run([&](const Tensor& in, Reduction r) { return l1_loss(in, target, r); }, l1, g_l1);
  run([&](const Tensor& in, Reduction r) { return smooth_l1_loss(in, target, r, k); }, sl1, g_sl1);
  run([&](const Tensor& in, Reduction r) { return huber_loss(in, target, r, k); }, hub, g_hub);
  // beta = 0 is L1 (PyTorch's rule; the formula would divide by 0).
  check_close(smooth_l1_loss(f64(x, {8}), target, Reduction::None, 0.0), l1, 1e-15);
}

TEST_CASE("kl_div matches PyTorch's definition for every reduction, log_target too",
          "[runtime][ops][loss]") {
  const bool log_target = GENERATE(false, true);
  INFO("log_target " << log_target);
  // [2, 3] log-probabilities; target probabilities with zeros (xlogy(0, 0) =
  // 0), but not as log targets: exp(-inf) (-inf - x) is NaN, in PyTorch too.
  const std::vector<double> x = {-1, -2, -3, -0.5, -1.5, -2.5};
  const std::vector<double> p = log_target ? std::vector<double>{0.1, 0.8, 0.1, 0.25, 0.25, 0.5}
                                           : std::vector<double>{0, 1, 0, 0.25, 0.25, 0.5};
  std::vector<double> t, ref;
  for (size_t i = 0; i < x.size(); ++i) {
    t.push_back(log_target ? std::log(p[i]) : p[i]);
    ref.push_back(p[i] == 0 ? 0 : p[i] * (std::log(p[i]) - x[i]));
  }
  const Tensor input = f64(x, {2, 3}), target = f64(t, {2, 3});
  check_close(kl_div(input, target, KlDivReduction::None, log_target), ref, 1e-15);
  CHECK(kl_div(input, target, KlDivReduction::Sum, log_target).item() == Approx(total(ref)));
  CHECK(kl_div(input, target, KlDivReduction::Mean, log_target).item() ==
        Approx(total(ref) / 6));
  CHECK(kl_div(input, target, KlDivReduction::BatchMean, log_target).item() ==
        Approx(total(ref) / 2));
  // The default is PyTorch's 'mean', over every element.
  if (!log_target) CHECK(kl_div(input, target).item() == Approx(total(ref) / 6));
  // The input's gradient is -p, 0 where the target is 0 (no NaN from its log).
  Tensor in = input.clone();
  in.requires_grad_();
  kl_div(in, target, KlDivReduction::BatchMean, log_target).backward();
  std::vector<double> expected;
  for (double pi : p) expected.push_back(-pi / 2);
  check_close(in.grad(), expected, 1e-15);
}

TEST_CASE("kl_div gradients match finite differences, for input and target",
          "[runtime][ops][loss]") {
  const bool log_target = GENERATE(false, true);
  const Tensor x = random_input({3, 4}, 9, -3, 0);
  const Tensor t = log_target ? random_input({3, 4}, 10, -3, 0) : random_input({3, 4}, 10, 0.1, 1);
  auto r = gradcheck(
      [&](const std::vector<Tensor>& in) {
        return kl_div(in[0], in[1], KlDivReduction::BatchMean, log_target);
      },
      {x, t});
  INFO(r.message);
  CHECK(r.ok);
}

TEST_CASE("kl_div: a negative target is NaN, an empty batch 0, a shape mismatch an error",
          "[runtime][ops][loss]") {
  const auto v = values(kl_div(f64({-1, -1}, {2}), f64({-0.5, 0.5}, {2}), KlDivReduction::None));
  CHECK(std::isnan(v[0]));
  CHECK(v[1] == Approx(0.5 * (std::log(0.5) + 1)));
  const Tensor e = Tensor::empty({0, 3});
  CHECK(kl_div(e, e, KlDivReduction::BatchMean).item() == 0);
  CHECK(kl_div(e, e, KlDivReduction::Mean).item() == 0);
  CHECK_THROWS_WITH(kl_div(Tensor::zeros({2, 3}), Tensor::zeros({3})), Contains("same shape"));
  CHECK_THROWS_WITH(kl_div(Tensor::zeros({}), Tensor::zeros({}), KlDivReduction::BatchMean),
                    Contains("use Sum or Mean"));
}
