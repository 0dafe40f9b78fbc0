// cross_entropy (with label smoothing and every reduction) and mse_loss:
// values against direct formulas, gradients, and argument errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "lockstep/runtime/ops/activation.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/loss.h"
#include "lockstep/runtime/ops/misc.h"
#include "lockstep/runtime/ops/reduce.h"
#include "lockstep/runtime/random.h"
#include "lockstep/runtime/tensor.h"
#include "support/gradcheck.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

namespace {

// Per-sample cross-entropy by its definition: the target distribution
// q = (1 - s) onehot(t) + s / C against log-probabilities log(exp(x) / sum exp(x)).
std::vector<double> cross_entropy_ref(const std::vector<double>& x, const std::vector<int64_t>& t,
                                      int64_t c, double s) {
  std::vector<double> out;
  for (size_t i = 0; i < t.size(); ++i) {
    double z = 0;
    for (int64_t j = 0; j < c; ++j) z += std::exp(x[i * c + j]);
    double loss = 0;
    for (int64_t j = 0; j < c; ++j) {
      const double q = (j == t[i] ? 1 - s : 0) + s / static_cast<double>(c);
      loss -= q * std::log(std::exp(x[i * c + j]) / z);
    }
    out.push_back(loss);
  }
  return out;
}

double total(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

}  // namespace

TEST_CASE("cross_entropy matches the direct formula", "[runtime][ops][loss]") {
  const DType dt = GENERATE(DType::f32, DType::f64);
  const double smoothing = GENERATE(0.0, 0.1, 1.0);
  const double tol = dt == DType::f32 ? 1e-5 : 1e-12;
  INFO("dtype " << dtype_name(dt) << ", label_smoothing " << smoothing);
  const std::vector<double> x = {1.0, 2.0, 0.5, -1.0,   //
                                 0.0, 0.0, 0.0, 0.0,    //
                                 3.0, -2.0, 1.5, 0.25};  // [3, 4]
  const std::vector<int64_t> t = {1, 3, 0};
  Tensor logits = Tensor::from_vector<double>(x, {3, 4}).to(dt);
  Tensor target = Tensor::from_vector<int64_t>(t, {3});
  const auto ref = cross_entropy_ref(x, t, 4, smoothing);

  Tensor none = cross_entropy(logits, target, smoothing, Reduction::None);
  CHECK(none.shape() == Shape{3});
  CHECK(none.dtype() == dt);
  check_close(none, ref, tol);
  Tensor sum_loss = cross_entropy(logits, target, smoothing, Reduction::Sum);
  CHECK(sum_loss.shape().empty());
  CHECK(sum_loss.item() == Approx(total(ref)).epsilon(tol));
  Tensor mean_loss = cross_entropy(logits, target, smoothing, Reduction::Mean);
  CHECK(mean_loss.shape().empty());
  CHECK(mean_loss.item() == Approx(total(ref) / 3).epsilon(tol));
  // The default is mean without smoothing.
  if (smoothing == 0.0) CHECK(cross_entropy(logits, target).item() == mean_loss.item());
  // i32 targets work the same.
  check_close(cross_entropy(logits, target.to(DType::i32), smoothing, Reduction::None), ref, tol);
}

TEST_CASE("cross_entropy of uniform logits is log C", "[runtime][ops][loss]") {
  Tensor logits = Tensor::zeros({2, 10});
  Tensor target = Tensor::from_vector<int64_t>({3, 9}, {2});
  CHECK(cross_entropy(logits, target).item() == Approx(std::log(10.0)));
  CHECK(cross_entropy(logits, target, 0.3).item() == Approx(std::log(10.0)));
}

TEST_CASE("cross_entropy is stable for large logits", "[runtime][ops][loss]") {
  Tensor logits = Tensor::from_vector<float>({1000, 0, -1000, 2000, 2001, 1999}, {2, 3});
  Tensor target = Tensor::from_vector<int64_t>({0, 2}, {2});
  auto l = values(cross_entropy(logits, target, 0.0, Reduction::None));
  CHECK(l[0] == Approx(0.0).margin(1e-6));
  // logsumexp(0, 1, -1) - (-1)
  CHECK(l[1] == Approx(std::log(1 + std::exp(1.0) + std::exp(-1.0)) + 1).epsilon(1e-5));
}

TEST_CASE("cross_entropy keeps log(sum) beside a large maximum, as PyTorch's log_softmax",
          "[runtime][ops][loss]") {
  // In f32, max + log(sum) rounds log(sum) away from |max| = 1e8: three equal
  // logits gave a loss of 0 instead of log(3).
  const double smoothing = GENERATE(0.0, 0.3);
  Tensor equal = Tensor::full({1, 3}, 1e8);
  Tensor target = Tensor::from_vector<int64_t>({0}, {1});
  CHECK(cross_entropy(equal, target, smoothing).item() == Approx(std::log(3.0)).epsilon(1e-6));
  // Shifted by 1e5 (whose f32 ulp is 0.008) the loss is the unshifted one.
  const std::vector<double> row = {0, 1, -1, 0.5};
  std::vector<double> shifted;
  for (double v : row) shifted.push_back(1e5 + v);
  Tensor logits = Tensor::from_vector<double>(shifted, {1, 4}).to(DType::f32);
  Tensor t = Tensor::from_vector<int64_t>({2}, {1});
  CHECK(cross_entropy(logits, t, smoothing).item() ==
        Approx(cross_entropy_ref(row, {2}, 4, smoothing)[0]).epsilon(1e-6));
}

TEST_CASE("cross_entropy without smoothing takes -inf (masked) logits", "[runtime][ops][loss]") {
  // The smoothing term is infinite here; weighted by 0 it must not turn into NaN.
  const double inf = std::numeric_limits<double>::infinity();
  Tensor logits = Tensor::from_vector<double>({0, -inf, 1, 1}, {2, 2});
  logits.requires_grad_();
  Tensor target = Tensor::from_vector<int64_t>({0, 1}, {2});
  Tensor loss = cross_entropy(logits, target, 0.0, Reduction::Sum);
  CHECK(loss.item() == Approx(std::log(2.0)));
  loss.backward();
  check_close(logits.grad(), {0, 0, 0.5, -0.5}, 1e-12);
}

TEST_CASE("cross_entropy gradient is (softmax - target distribution) / N",
          "[runtime][ops][loss]") {
  const double smoothing = GENERATE(0.0, 0.1);
  Generator g(3);
  Tensor logits = randn({4, 5}, DType::f64, g);
  logits.requires_grad_();
  Tensor target = Tensor::from_vector<int64_t>({4, 0, 2, 2}, {4});
  cross_entropy(logits, target, smoothing).backward();
  auto p = values(softmax(logits.detach(), 1));
  std::vector<double> expected;
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 5; ++j) {
      const double q = (j == values(target)[i] ? 1 - smoothing : 0) + smoothing / 5;
      expected.push_back((p[i * 5 + j] - q) / 4);
    }
  check_close(logits.grad(), expected, 1e-12);
}

TEST_CASE("cross_entropy gradients match finite differences", "[runtime][ops][loss][gradcheck]") {
  Tensor logits = random_input({5, 4}, 1, -2.0, 2.0);
  Tensor logits_t = random_input({4, 5}, 2, -2.0, 2.0);
  Tensor target = Tensor::from_vector<int64_t>({0, 3, 3, 1, 2}, {5});
  for (double s : {0.0, 0.1, 0.5}) {
    for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
      INFO("label_smoothing " << s << ", reduction " << static_cast<int>(r));
      check_grad("cross_entropy",
                 [&](auto& in) { return cross_entropy(in[0], target, s, r); }, {logits});
      check_grad("cross_entropy of a transposed view",
                 [&](auto& in) { return cross_entropy(in[0].t(), target, s, r); }, {logits_t});
    }
  }
  check_grad("cross_entropy of a computed input", [&](auto& in) {
    return cross_entropy(mul(in[0], in[0]), target, 0.1);
  }, {logits});
}

TEST_CASE("cross_entropy argument errors", "[runtime][ops][loss]") {
  Tensor logits = Tensor::zeros({3, 4});
  CHECK_THROWS_AS(cross_entropy(logits, Tensor::from_vector<int64_t>({0, 4, 1}, {3})),
                  lockstep::Error);
  CHECK_THROWS_WITH(cross_entropy(logits, Tensor::from_vector<int64_t>({0, 4, 1}, {3})),
                    Contains("target[1] = 4") && Contains("[0, 4)"));
  CHECK_THROWS_WITH(cross_entropy(logits, Tensor::from_vector<int64_t>({0, 1, -1}, {3})),
                    Contains("target[2] = -1"));
  CHECK_THROWS_WITH(cross_entropy(logits, Tensor::from_vector<int32_t>({7, 1, 1}, {3})),
                    Contains("target[0] = 7"));
  CHECK_THROWS_WITH(cross_entropy(logits, Tensor::from_vector<int64_t>({0, 1, -1}, {3})),
                    Contains("pass ignore_index"));
  // With an ignore_index of another value, the hint names it instead of asking for one.
  const std::string other = error_of([&] {
    cross_entropy(logits, Tensor::from_vector<int64_t>({0, -100, 1}, {3}), 0.0, Reduction::Mean,
                  -1);
  });
  CHECK_THAT(other, Contains("target[1] = -100") &&
                        Contains("only targets equal to ignore_index = -1 are skipped"));
  CHECK_THAT(other, !Contains("pass ignore_index"));
  CHECK_THROWS_WITH(cross_entropy(logits, Tensor::from_vector<int64_t>({0, 1}, {2})),
                    Contains("[3]") && Contains("[2]"));
  CHECK_THROWS_WITH(cross_entropy(logits, Tensor::zeros({3})), Contains("class indices") &&
                                                                    Contains("f32"));
  CHECK_THROWS_WITH(cross_entropy(Tensor::zeros({3}), Tensor::zeros({3}, DType::i64)),
                    Contains("[N, C]"));
  CHECK_THROWS_WITH(cross_entropy(logits, Tensor::zeros({3}, DType::i64), 1.5),
                    Contains("label_smoothing"));
  CHECK_THROWS_WITH(cross_entropy(logits, Tensor::zeros({3}, DType::i64), -0.1),
                    Contains("label_smoothing"));
}

TEST_CASE("cross_entropy with ignore_index: ignored samples add nothing, Mean over the kept",
          "[runtime][ops][loss]") {
  const double smoothing = GENERATE(0.0, 0.1);
  INFO("label_smoothing " << smoothing);
  Generator g(7);
  const Tensor x = randn({4, 5}, DType::f64, g);
  const Tensor target = Tensor::from_vector<int64_t>({4, -100, 2, -100}, {4});
  const std::vector<double> xs = values(x);
  const auto ref = cross_entropy_ref(xs, {4, 0, 2, 0}, 5, smoothing);
  const std::vector<double> want_none{ref[0], 0.0, ref[2], 0.0};
  check_close(cross_entropy(x, target, smoothing, Reduction::None, -100), want_none, 1e-12);
  CHECK(cross_entropy(x, target, smoothing, Reduction::Sum, -100).item() ==
        Approx(ref[0] + ref[2]).epsilon(1e-12));
  Tensor logits = x.clone().requires_grad_();
  Tensor loss = cross_entropy(logits, target.to(DType::i32), smoothing, Reduction::Mean, -100);
  CHECK(loss.item() == Approx((ref[0] + ref[2]) / 2).epsilon(1e-12));
  loss.backward();
  // The kept rows' gradient is that of a batch of the two of them; the ignored rows get 0.
  Tensor kept = cat({x.slice(0, 0, 1), x.slice(0, 2, 3)}, 0).requires_grad_();
  cross_entropy(kept, Tensor::from_vector<int64_t>({4, 2}, {2}), smoothing).backward();
  const std::vector<double> gk = values(kept.grad()), got = values(logits.grad());
  for (int64_t j = 0; j < 5; ++j) {
    CHECK(got[j] == Approx(gk[j]).margin(1e-15));
    CHECK(got[10 + j] == Approx(gk[5 + j]).margin(1e-15));
    CHECK(got[5 + j] == 0.0);
    CHECK(got[15 + j] == 0.0);
  }
  check_grad("cross_entropy with ignore_index",
             [&](auto& in) { return cross_entropy(in[0], target, smoothing, Reduction::Mean, -100); },
             {random_input({4, 5}, 3, -2.0, 2.0)});
}

TEST_CASE("cross_entropy with ignore_index: every sample ignored gives 0 and no gradient; "
          "without it -100 is an error that names the option",
          "[runtime][ops][loss]") {
  Tensor logits = Tensor::zeros({2, 3}).requires_grad_();
  const Tensor all_ignored = Tensor::from_vector<int64_t>({7, 7}, {2});
  Tensor loss = cross_entropy(logits, all_ignored, 0.0, Reduction::Mean, 7);
  CHECK(loss.item() == 0.0);
  loss.backward();
  check_close(logits.grad(), std::vector<double>(6, 0.0), 0.0);
  // Any index may be the one ignored, and the others are still checked.
  CHECK_THROWS_WITH(cross_entropy(logits, Tensor::from_vector<int64_t>({7, 3}, {2}), 0.0,
                                  Reduction::Mean, 7),
                    Contains("target[1] = 3"));
  CHECK_THROWS_WITH(cross_entropy(logits, Tensor::from_vector<int64_t>({1, -100}, {2})),
                    Contains("target[1] = -100") && Contains("pass ignore_index"));
  CHECK_THROWS_WITH(cross_entropy(logits, Tensor::zeros({2}), 0.0, Reduction::Mean, -100),
                    Contains("class indices"));
}

TEST_CASE("cross_entropy with ignore_index: an ignored row adds exactly 0 whatever its logits",
          "[runtime][ops][loss]") {
  // Row 1 is ignored and its logits are -inf (a masked vocabulary, a padding
  // row): multiplying its loss by 0 used to give 0 * inf = NaN.
  const double smoothing = GENERATE(0.0, 0.1);
  INFO("label_smoothing " << smoothing);
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> xs{1, 2, 0.5, -inf, -inf, -inf, 0.3, -1, 2};
  const Tensor target = Tensor::from_vector<int64_t>({1, -100, 2}, {3});
  Tensor logits = Tensor::from_vector<double>(xs, {3, 3}).requires_grad_();
  const auto ref = cross_entropy_ref({1, 2, 0.5, 0.3, -1, 2}, {1, 2}, 3, smoothing);
  const std::vector<double> none = values(cross_entropy(logits, target, smoothing,
                                                        Reduction::None, -100));
  CHECK(none[0] == Approx(ref[0]).epsilon(1e-12));
  CHECK(none[1] == 0.0);
  CHECK(none[2] == Approx(ref[1]).epsilon(1e-12));
  Tensor loss = cross_entropy(logits, target, smoothing, Reduction::Mean, -100);
  CHECK(loss.item() == Approx((ref[0] + ref[1]) / 2).epsilon(1e-12));
  loss.backward();
  const std::vector<double> g = values(logits.grad());
  for (int j = 0; j < 3; ++j) {
    CHECK(std::isfinite(g[j]));
    CHECK(g[3 + j] == 0.0);
    CHECK(std::isfinite(g[6 + j]));
  }
}

TEST_CASE("cross_entropy with ignore_index: Sum and Mean of 16-bit logits add in f32",
          "[runtime][ops][loss]") {
  // 4000 kept rows of loss ~20: the sum, 80000, is past f16's largest value
  // (65504), and the count past where bf16 counts exactly (256).
  const DType dt = GENERATE(DType::f16, DType::bf16);
  INFO(dtype_name(dt));
  const int64_t n = 4000;
  std::vector<double> xs;
  std::vector<int64_t> ts;
  for (int64_t i = 0; i < n; ++i) {
    xs.insert(xs.end(), {0.0, -20.0});
    ts.push_back(i % 1000 == 999 ? -100 : 1);  // 4 ignored
  }
  const Tensor x = Tensor::from_vector<double>(xs, {n, 2}).to(dt);
  const Tensor t = Tensor::from_vector<int64_t>(ts, {n});
  const double per_row = std::log1p(std::exp(-20.0)) + 20.0;
  const Tensor mean = cross_entropy(x, t, 0.0, Reduction::Mean, -100);
  CHECK(mean.dtype() == dt);
  CHECK(mean.item() == Approx(per_row).epsilon(dt == DType::f16 ? 1e-3 : 1e-2));
  const Tensor mean_f32 = cross_entropy(x.to(DType::f32), t, 0.0, Reduction::Mean, -100);
  CHECK(mean_f32.item() == Approx(per_row).epsilon(1e-5));
}

TEST_CASE("mse_loss for every reduction", "[runtime][ops][loss]") {
  const DType dt = GENERATE(DType::f32, DType::f64);
  Tensor in = Tensor::from_vector<double>({1, 2, 3, 4}, {2, 2}).to(dt);
  Tensor tg = Tensor::from_vector<double>({1, 0, 5, 1}, {2, 2}).to(dt);
  // squared errors 0, 4, 4, 9
  CHECK(mse_loss(in, tg).item() == Approx(17.0 / 4));
  CHECK(mse_loss(in, tg).shape().empty());
  CHECK(mse_loss(in, tg, Reduction::Sum).item() == Approx(17.0));
  Tensor none = mse_loss(in, tg, Reduction::None);
  CHECK(none.shape() == Shape{2, 2});
  CHECK(values(none) == std::vector<double>{0, 4, 4, 9});
  CHECK_THROWS_WITH(mse_loss(in, Tensor::zeros({4}, dt)),
                    Contains("[2, 2]") && Contains("[4]"));
}

TEST_CASE("mse_loss gradients", "[runtime][ops][loss][gradcheck]") {
  Tensor in = random_input({3, 4}, 1);
  Tensor tg = random_input({3, 4}, 2);
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    INFO("reduction " << static_cast<int>(r));
    check_grad("mse both", [&](auto& x) { return mse_loss(x[0], x[1], r); }, {in, tg});
  }
  // d/dx mean((x - y)^2) = 2 (x - y) / n.
  Tensor x = Tensor::from_vector<double>({1, 2}, {2});
  x.requires_grad_();
  mse_loss(x, Tensor::from_vector<double>({0, 4}, {2})).backward();
  CHECK(values(x.grad()) == std::vector<double>{1, -2});
}
