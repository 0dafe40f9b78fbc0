// nll_loss: values against PyTorch 1.13's definition (the weighted mean
// divides by the kept targets' weights), gradients, ignore_index, errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "lockstep/runtime/ops/activation.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/loss.h"
#include "lockstep/runtime/ops/nll_loss.h"
#include "lockstep/runtime/ops/reduce.h"
#include "lockstep/runtime/tensor.h"
#include "support/gradcheck.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

TEST_CASE("nll_loss matches PyTorch's weighted mean, with ignore_index", "[runtime][ops][loss]") {
  const DType dt = GENERATE(DType::f32, DType::f64);
  const bool weighted = GENERATE(false, true);
  INFO("dtype " << dtype_name(dt) << ", weighted " << weighted);
  // PyTorch 1.13: nll_loss(x, [0, 2, -100], weight=[1, 2, 3]) is [1, 7.5, 0], mean 2.125.
  const std::vector<double> x = {-1, -2, -3, -0.5, -1.5, -2.5, -3, -0.1, -2};
  const std::vector<int64_t> t = {0, 2, -100};
  const std::vector<double> w = {1, 2, 3};
  const Tensor input = Tensor::from_vector<double>(x, {3, 3}).to(dt);
  const Tensor target = Tensor::from_vector<int64_t>(t, {3});
  NllOptions o{.ignore_index = -100, .reduction = Reduction::None};
  if (weighted) o.weight = Tensor::from_vector<double>(w, {3}).to(dt);
  const std::vector<double> ref = weighted ? std::vector<double>{1, 7.5, 0}
                                           : std::vector<double>{1, 2.5, 0};
  check_close(nll_loss(input, target, o), ref, 1e-6);
  o.reduction = Reduction::Sum;
  CHECK(nll_loss(input, target, o).item() == Approx(ref[0] + ref[1]));
  o.reduction = Reduction::Mean;
  CHECK(nll_loss(input, target, o).item() == Approx(weighted ? 8.5 / 4 : 3.5 / 2));
  // i32 targets work the same.
  CHECK(nll_loss(input, target.to(DType::i32), o).item() == Approx(weighted ? 8.5 / 4 : 3.5 / 2));
  // No sample kept: 0, not PyTorch's NaN (as cross_entropy).
  const Tensor all_ignored = Tensor::full({3}, -100, DType::i64);
  CHECK(nll_loss(input, all_ignored, o).item() == 0);
}

TEST_CASE("nll_loss of log_softmax is cross_entropy, values and gradients",
          "[runtime][ops][loss]") {
  const Tensor logits = random_input({4, 5}, 7, -3, 3);
  const Tensor target = Tensor::from_vector<int64_t>({4, 0, 2, 2}, {4});
  const Tensor a = nll_loss(log_softmax(logits, 1), target);
  CHECK(a.item() == Approx(cross_entropy(logits, target).item()).epsilon(1e-12));
  a.backward();
  Tensor again = logits.detach().clone();
  again.requires_grad_();
  cross_entropy(again, target).backward();
  check_close(logits.grad(), values(again.grad()), 1e-12);
}

TEST_CASE("nll_loss gradients match finite differences, weighted and ignoring",
          "[runtime][ops][loss]") {
  const Tensor x = random_input({5, 3}, 8, -3, 0);
  const Tensor target = Tensor::from_vector<int64_t>({2, -1, 0, 2, 1}, {5});
  const Tensor w = Tensor::from_vector<double>({0.5, 2, 1.5}, {3});
  const Reduction r = GENERATE(Reduction::Mean, Reduction::Sum, Reduction::None);
  auto res = gradcheck(
      [&](const std::vector<Tensor>& in) {
        return nll_loss(in[0], target, {.weight = w, .ignore_index = -1, .reduction = r});
      },
      {x});
  INFO(res.message);
  CHECK(res.ok);
}

TEST_CASE("nll_loss over an empty batch is 0 with an empty gradient", "[runtime][ops][loss]") {
  Tensor x = Tensor::zeros({0, 4});
  x.requires_grad_();
  const Tensor t = Tensor::empty({0}, DType::i64);
  Tensor l = nll_loss(x, t);
  CHECK(l.item() == 0);
  l.backward();
  CHECK(x.grad().shape() == Shape{0, 4});
  CHECK(nll_loss(x, t, {.reduction = Reduction::None}).shape() == Shape{0});
}

TEST_CASE("nll_loss refuses bad targets, shapes and weights, saying what to do",
          "[runtime][ops][loss]") {
  const Tensor x = Tensor::zeros({2, 3});
  CHECK_THROWS_WITH(nll_loss(x, Tensor::from_vector<int64_t>({0, 3}, {2})),
                    Contains("target[1] = 3 is not a class index in [0, 3)"));
  CHECK_THROWS_WITH(nll_loss(x, Tensor::from_vector<int64_t>({-100, 0}, {2})),
                    Contains("pass ignore_index"));
  CHECK_THROWS_WITH(nll_loss(x, Tensor::from_vector<int64_t>({-1, 0}, {2}), {.ignore_index = -100}),
                    Contains("only targets equal to ignore_index = -100 are skipped"));
  CHECK_THROWS_WITH(nll_loss(x, Tensor::zeros({2})), Contains("i64 or i32"));
  CHECK_THROWS_WITH(nll_loss(Tensor::zeros({2, 3, 4}), Tensor::zeros({2}, DType::i64)),
                    Contains("for an input [2, 3, 4] = [N, C, d1, ...] the target must be "
                             "[N, d1, ...] = [2, 4] class indices, got [2]"));
  CHECK_THROWS_WITH(nll_loss(Tensor::zeros({3}), Tensor::zeros({}, DType::i64)),
                    Contains("input must be [N, C] or [N, C, d1, ...]"));
  CHECK_THROWS_WITH(nll_loss(x, Tensor::zeros({3}, DType::i64)), Contains("[N] = [2]"));
  CHECK_THROWS_WITH(nll_loss(x, Tensor::zeros({2}, DType::i64), {.weight = Tensor::ones({2})}),
                    Contains("weight must be [C] = [3]"));
}

TEST_CASE("nll_loss reads an ignored row as 0 even when it holds -inf", "[runtime][ops][loss]") {
  const double inf = std::numeric_limits<double>::infinity();
  Tensor x = Tensor::from_vector<double>({-inf, 0, -0.5, -1}, {2, 2});
  x.requires_grad_();
  const Tensor t = Tensor::from_vector<int64_t>({-1, 1}, {2});
  const Tensor l = nll_loss(x, t, {.ignore_index = -1, .reduction = Reduction::None});
  check_close(l, {0, 1}, 0);
  sum(l).backward();
  check_close(x.grad(), {0, 0, 0, -1}, 0);
}

TEST_CASE("cross_entropy with a class weight matches PyTorch's formula, smoothing included",
          "[runtime][ops][loss]") {
  const double s = GENERATE(0.0, 0.2);
  const bool ignoring = GENERATE(false, true);
  INFO("label_smoothing " << s << ", ignoring " << ignoring);
  const std::vector<double> x = {1, 2, 0.5, -1, 0, 0, 0, 0, 3, -2, 1.5, 0.25};  // [3, 4]
  const std::vector<int64_t> t = {1, 3, ignoring ? -100 : 2};
  const std::vector<double> w = {1, 2, 0.5, 3};
  // PyTorch 1.13: per kept sample (1-s) w[t] (-logp[t]) + (s/C) sum_j w[j] (-logp[j]);
  // Mean divides by the kept samples' w[t] summed.
  std::vector<double> ref;
  double wsum = 0;
  for (int64_t i = 0; i < 3; ++i) {
    if (t[i] == -100) {
      ref.push_back(0);
      continue;
    }
    double z = 0;
    for (int64_t j = 0; j < 4; ++j) z += std::exp(x[i * 4 + j]);
    double smooth = 0;
    for (int64_t j = 0; j < 4; ++j) smooth -= w[j] * (x[i * 4 + j] - std::log(z));
    ref.push_back((1 - s) * w[t[i]] * (std::log(z) - x[i * 4 + t[i]]) + s / 4 * smooth);
    wsum += w[t[i]];
  }
  const double ref_sum = ref[0] + ref[1] + ref[2];
  const Tensor logits = Tensor::from_vector<double>(x, {3, 4});
  const Tensor target = Tensor::from_vector<int64_t>(t, {3});
  const Tensor weight = Tensor::from_vector<double>(w, {4});
  const std::optional<int64_t> ig = ignoring ? std::optional<int64_t>(-100) : std::nullopt;
  check_close(cross_entropy(logits, target, weight, s, Reduction::None, ig), ref, 1e-12);
  CHECK(cross_entropy(logits, target, weight, s, Reduction::Sum, ig).item() == Approx(ref_sum));
  CHECK(cross_entropy(logits, target, weight, s, Reduction::Mean, ig).item() ==
        Approx(ref_sum / wsum));
  // A weight of ones is the unweighted loss; gradients match finite differences.
  CHECK(cross_entropy(logits, target, Tensor::ones({4}, DType::f64), s, Reduction::Mean, ig)
            .item() == Approx(cross_entropy(logits, target, s, Reduction::Mean, ig).item()));
  auto r = gradcheck(
      [&](const std::vector<Tensor>& in) {
        return cross_entropy(in[0], target, weight, s, Reduction::Mean, ig);
      },
      {random_input({3, 4}, 12, -2, 2)});
  INFO(r.message);
  CHECK(r.ok);
}

// PyTorch 1.13, x[i] = fmod(0.37 i, 1.3) - 0.6 as [2, 3, 2, 2], t = [[[0, 2], [1, -100]],
// [[2, 2], [0, 1]]], w = [0.5, 2, 1.5], ignore_index=-100 (float64):
//   nll_loss(x, t, w, reduction='none') = the values below, 'sum' -2.19, 'mean' -0.2305263...,
//   its mean's x.grad nonzero at the picked entries; cross_entropy(x, t, label_smoothing=0.1)
//   with and without w as below.
TEST_CASE("nll_loss and cross_entropy take PyTorch's spatial input with classes in dim 1",
          "[runtime][ops][loss]") {
  std::vector<double> xv(24);
  for (size_t i = 0; i < xv.size(); ++i)
    xv[i] = std::fmod(0.37 * static_cast<double>(i), 1.3) - 0.6;
  const Tensor target =
      Tensor::from_vector<int64_t>({0, 2, 1, -100, 2, 2, 0, 1}, {2, 2, 2});
  const Tensor w = Tensor::from_vector<double>({0.5, 2.0, 1.5}, {3});
  auto input = [&] {
    return Tensor::from_vector<double>(xv, {2, 3, 2, 2}).requires_grad_();
  };
  NllOptions o{.weight = w, .ignore_index = -100, .reduction = Reduction::None};
  const Tensor none = nll_loss(input(), target, o);
  CHECK(none.shape() == Shape{2, 2, 2});
  check_close(none, {0.3, -0.195, -0.64, 0.0, -0.45, -1.005, -0.34, 0.14}, 1e-9);
  o.reduction = Reduction::Sum;
  CHECK(nll_loss(input(), target, o).item() == Approx(-2.19).epsilon(1e-9));
  o.reduction = Reduction::Mean;
  Tensor x = input();
  const Tensor mean = nll_loss(x, target, o);
  CHECK(mean.item() == Approx(-0.23052631578947355).epsilon(1e-9));
  mean.backward();
  const double a = 0.05263157894736842, b = 0.21052631578947367, c = 0.15789473684210525;
  check_close(x.grad(), {-a, 0, 0, 0, 0, 0, -b, 0, 0, -c, 0, 0,
                         0, 0, -a, 0, 0, 0, 0, -b, -c, -c, 0, 0}, 1e-9);

  x = input();
  const Tensor ce_w = cross_entropy(x, target, w, 0.1, Reduction::Mean, -100);
  CHECK(ce_w.item() == Approx(1.0133140887654362).epsilon(1e-9));
  ce_w.backward();
  check_close(x.grad(),
              {-0.03220978742793492, 0.041253006705807595, 0.05430019324636306, 0.0,
               0.013231016855850018, 0.0444716533883344, -0.12938171255594974, 0.0,
               0.018978770572084906, -0.08572466009414198, 0.07508151930958669, 0.0,
               0.041253006705807574, 0.041253006705807595, -0.013358792868110973,
               0.05430019324636306, 0.04447165338833438, 0.044471653388334406,
               0.004651531331923324, -0.1293817125559497, -0.08572466009414195,
               -0.085724660094142, 0.008707261536187658, 0.07508151930958665},
              1e-9);

  x = input();
  const Tensor ce = cross_entropy(x, target, 0.1, Reduction::Mean, -100);
  CHECK(ce.item() == Approx(0.9916415765955156).epsilon(1e-9));
  ce.backward();
  check_close(x.grad(),
              {-0.0939846755126105, 0.03458675305881809, 0.034586753058818094, 0.0,
               0.042346991596603455, 0.04234699159660345, -0.08622443697482517, 0.0,
               0.05163768391600708, -0.07693374465542153, 0.05163768391600709, 0.0,
               0.034586753058818066, 0.03458675305881809, -0.05012725959791805,
               0.034586753058818094, 0.042346991596603434, 0.042346991596603455,
               0.022386555887876042, -0.08622443697482514, -0.07693374465542151,
               -0.07693374465542153, 0.02774070371004204, 0.05163768391600707},
              1e-9);
  const Tensor ce_none = cross_entropy(input(), target, 0.0, Reduction::None, -100);
  CHECK(ce_none.shape() == Shape{2, 2, 2});
  check_close(ce_none, {1.28938326439423, 0.92938326439423, 1.1093832643942303, 0.0,
                        0.9293832643942297, 0.9293832643942301, 0.5405247831365624,
                        1.1093832643942296},
              1e-9);
  CHECK_THROWS_WITH(cross_entropy(input(), Tensor::zeros({2, 2}, DType::i64)),
                    Contains("the target must be [N, d1, ...] = [2, 2, 2] class indices, "
                             "got [2, 2]"));
}

// PyTorch 1.13, float64: x = [[0.2, -1, 0.5], [1.5, 0.3, -0.4]], p = [[0.7, 0.2, 0.1],
// [0, 0.5, 0.5]], w = [0.5, 2, 1.5]; cross_entropy(x, p, ...) as below.
TEST_CASE("cross_entropy takes class probabilities as the target as PyTorch does",
          "[runtime][ops][loss]") {
  auto input = [] {
    return Tensor::from_vector<double>({0.2, -1.0, 0.5, 1.5, 0.3, -0.4}, {2, 3}).requires_grad_();
  };
  const Tensor p = Tensor::from_vector<double>({0.7, 0.2, 0.1, 0.0, 0.5, 0.5}, {2, 3});
  const Tensor w = Tensor::from_vector<double>({0.5, 2.0, 1.5}, {3});
  check_close(cross_entropy(input(), p, 0.0, Reduction::None),
              {1.18495692691384, 1.92208950853324}, 1e-12);
  CHECK(cross_entropy(input(), p, 0.0, Reduction::Sum).item() ==
        Approx(3.10704643544708).epsilon(1e-12));
  CHECK(cross_entropy(input(), p).item() == Approx(1.55352321772354).epsilon(1e-12));
  Tensor x = input();
  const Tensor l = cross_entropy(x, p, w, 0.2);
  CHECK(l.item() == Approx(2.2550533410552).epsilon(1e-12));  // Mean over 2 samples
  l.backward();
  check_close(x.grad(), {0.02942290970423, -0.17061756336656, 0.14119465366234,
                         0.5577437851654, -0.29365756331297, -0.26408622185243},
              1e-12);

  // Spatial: x3 = arange(12) * 0.1 as [2, 3, 2], p3 = softmax(arange(12) as [2, 3, 2] flipped
  // in dim 1, dim 1): every position's loss 1.28208885106837; weighted mean 0.85117844065597.
  const Tensor x3 = mul(Tensor::arange(12, DType::f64), 0.1).reshape({2, 3, 2});
  const double a = 0.86681333219733, b = 0.1173104278262, c = 0.01587623997647;
  const Tensor p3 = Tensor::from_vector<double>({a, a, b, b, c, c, a, a, b, b, c, c}, {2, 3, 2});
  const Tensor none = cross_entropy(x3, p3, 0.0, Reduction::None);
  CHECK(none.shape() == Shape{2, 2});
  check_close(none, std::vector<double>(4, 1.28208885106837), 1e-9);
  CHECK(cross_entropy(x3, p3, w).item() == Approx(0.85117844065597).epsilon(1e-9));

  CHECK_THROWS_WITH(cross_entropy(input(), Tensor::zeros({2, 3}, DType::i64)),
                    Contains("holds class probabilities and must be floating, got i64"));
  CHECK_THROWS_WITH(cross_entropy(input(), p, 0.0, Reduction::Mean, 0),
                    Contains("ignore_index (0) is not supported with class-probability targets"));
  CHECK(cross_entropy(input(), p, 0.0, Reduction::Mean, -100).item() ==
        Approx(1.55352321772354).epsilon(1e-12));
}
