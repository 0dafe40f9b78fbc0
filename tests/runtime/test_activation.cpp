// Activations and (log-)softmax: values against direct formulas, numerical
// stability at large inputs, and gradient checks.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "lockstep/runtime/ops/activation.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/reduce.h"
#include "lockstep/runtime/tensor.h"
#include "support/gradcheck.h"
#include "support/test_util.h"
#include "support/vector_isa_variants.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

namespace {

double tolerance(DType dt) { return dt == DType::f32 ? 1e-6 : 1e-12; }

const std::vector<double> kInputs = {-3.0, -1.0, -0.25, 0.0, 0.5, 2.0};

std::vector<double> map(const std::vector<double>& v, double (*f)(double)) {
  std::vector<double> out;
  for (double x : v) out.push_back(f(x));
  return out;
}

// Softmax (or log-softmax) of a row-major [rows, cols] matrix along `dim`.
std::vector<double> softmax_ref(const std::vector<double>& v, int64_t rows, int64_t cols,
                                int64_t dim, bool log) {
  std::vector<double> out(v.size());
  const int64_t n = dim == 0 ? rows : cols, m = dim == 0 ? cols : rows;
  for (int64_t o = 0; o < m; ++o) {
    auto at = [&](int64_t i) { return dim == 0 ? i * cols + o : o * cols + i; };
    double z = 0;
    for (int64_t i = 0; i < n; ++i) z += std::exp(v[at(i)]);
    for (int64_t i = 0; i < n; ++i)
      out[at(i)] = log ? v[at(i)] - std::log(z) : std::exp(v[at(i)]) / z;
  }
  return out;
}

}  // namespace

TEST_CASE("relu, gelu, sigmoid, tanh against their formulas", "[runtime][ops][activation]") {
  const DType dt = GENERATE(DType::f32, DType::f64);
  const double tol = tolerance(dt);
  Tensor x = Tensor::from_vector<double>(kInputs, {2, 3}).to(dt);
  CHECK(relu(x).dtype() == dt);
  CHECK(relu(x).shape() == Shape{2, 3});
  check_close(relu(x), {0, 0, 0, 0, 0.5, 2}, tol);
  check_close(gelu(x), map(kInputs, [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }),
              tol);
  check_close(sigmoid(x), map(kInputs, [](double v) { return 1 / (1 + std::exp(-v)); }), tol);
  check_close(tanh(x), map(kInputs, [](double v) { return std::tanh(v); }), tol);
  // Known values: gelu(1) = 0.8413447460685429, sigmoid(0) = 1/2.
  CHECK(gelu(Tensor::scalar(1.0, dt)).item() == Approx(0.8413447460685429).epsilon(tol));
  CHECK(sigmoid(Tensor::scalar(0.0, dt)).item() == 0.5);
  // On a non-contiguous view.
  check_close(relu(x.t()), {0, 0, 0, 0.5, 0, 2}, tol);
  CHECK_THROWS_WITH(relu(Tensor::ones({2}, DType::i64)), Contains("relu") && Contains("i64"));
}

TEST_CASE("sigmoid and tanh saturate without overflow", "[runtime][ops][activation]") {
  const DType dt = GENERATE(DType::f32, DType::f64);
  Tensor x = Tensor::from_vector<double>({-1000, -100, 100, 1000}, {4}).to(dt);
  auto s = values(sigmoid(x));
  CHECK(s[0] == 0.0);
  CHECK(s[1] == Approx(std::exp(-100.0)).margin(1e-40));
  CHECK(s[2] == 1.0);
  CHECK(s[3] == 1.0);
  for (double v : s) CHECK_FALSE(std::isnan(v));
  CHECK(values(tanh(x)) == std::vector<double>{-1, -1, 1, 1});
}

TEST_CASE("softmax and log_softmax along dim 0 and 1", "[runtime][ops][activation]") {
  const DType dt = GENERATE(DType::f32, DType::f64);
  const double tol = tolerance(dt) * 10;
  const std::vector<double> v = {0.5, -1, 2, 0, 3, 1, -2, 0.25, 1, 1, 1, 1};  // [3, 4]
  Tensor x = Tensor::from_vector<double>(v, {3, 4}).to(dt);
  for (int64_t dim : {0, 1}) {
    INFO("dim " << dim);
    Tensor s = softmax(x, dim);
    CHECK(s.shape() == Shape{3, 4});
    CHECK(s.dtype() == dt);
    check_close(s, softmax_ref(v, 3, 4, dim, false), tol);
    check_close(log_softmax(x, dim), softmax_ref(v, 3, 4, dim, true), tol);
    // Sums along dim are 1.
    check_close(sum(s, {dim}), std::vector<double>(dim == 0 ? 4 : 3, 1.0), tol);
  }
  check_close(softmax(x, -1), values(softmax(x, 1)), tol);
  check_close(log_softmax(x, -2), values(log_softmax(x, 0)), tol);
  // Along the middle dim of a 3-D tensor, and on a transposed view.
  Tensor x3 = Tensor::from_vector<double>(v, {1, 3, 4}).to(dt);
  check_close(softmax(x3, 1), softmax_ref(v, 3, 4, 0, false), tol);
  check_close(log_softmax(x.t(), 1), values(log_softmax(x, 0).t()), tol);
  CHECK_THROWS_WITH(softmax(x, 2), Contains("out of range"));
}

TEST_CASE("softmax is stable for large inputs", "[runtime][ops][activation]") {
  const DType dt = GENERATE(DType::f32, DType::f64);
  Tensor x = Tensor::from_vector<double>({1000, 1001, 1002, -1000, -1001, -1002}, {2, 3}).to(dt);
  const std::vector<double> row = {0.09003057317038046, 0.24472847105479767, 0.6652409557748219};
  const std::vector<double> expected = {row[0], row[1], row[2], row[2], row[1], row[0]};
  check_close(softmax(x, 1), expected, 1e-6);
  const double tol = dt == DType::f32 ? 1e-6 : 1e-12;
  auto ls = values(log_softmax(x, 1));
  for (size_t i = 0; i < ls.size(); ++i) CHECK(ls[i] == Approx(std::log(expected[i])).margin(tol));
}

TEST_CASE("log_softmax keeps log(sum) beside a large maximum: (x - max) - log(sum), as PyTorch",
          "[runtime][ops][activation]") {
  // In f32, 1e8 + log(3) rounds to 1e8, so max + log(sum) lost the log(sum)
  // whole: log_softmax gave 0 for each of three equal logits, and its
  // gradient, which reads exp(y), did not sum to 0.
  Tensor x = Tensor::full({1, 3}, 1e8);
  x.requires_grad_();
  Tensor y = log_softmax(x, 1);
  check_close(y, {-std::log(3.0), -std::log(3.0), -std::log(3.0)}, 1e-6);
  sum(mul(y, Tensor::from_vector<float>({1, 0, 0}, {1, 3}))).backward();
  check_close(x.grad(), {2.0 / 3, -1.0 / 3, -1.0 / 3}, 1e-6);
  // Shifted by 1e5 (whose f32 ulp is 0.008) the result is the unshifted one.
  const std::vector<double> row = {0, 1, -1, 0.5};
  std::vector<double> shifted;
  for (double v : row) shifted.push_back(1e5 + v);
  check_close(log_softmax(Tensor::from_vector<double>(shifted, {1, 4}).to(DType::f32), 1),
              softmax_ref(row, 1, 4, 1, true), 1e-6);
}

TEST_CASE("activation gradients match finite differences",
          "[runtime][ops][activation][gradcheck]") {
  // Values away from relu's kink at 0.
  Tensor x = random_input({3, 4}, 1);
  {
    double* p = x.detach().data_ptr<double>();
    for (int64_t i = 0; i < x.numel(); ++i)
      if (std::abs(p[i]) < 0.05) p[i] = 0.3;
  }
  Tensor xt = random_input({4, 3}, 2, -3.0, 3.0);
  check_grad("relu", [](auto& in) { return relu(in[0]); }, {x});
  check_grad("gelu", [](auto& in) { return gelu(in[0]); }, {xt});
  check_grad("sigmoid", [](auto& in) { return sigmoid(in[0]); }, {xt});
  check_grad("tanh", [](auto& in) { return tanh(in[0]); }, {xt});
  check_grad("softmax dim 1", [](auto& in) { return softmax(in[0], 1); }, {x});
  check_grad("softmax dim 0", [](auto& in) { return softmax(in[0], 0); }, {x});
  check_grad("log_softmax dim 1", [](auto& in) { return log_softmax(in[0], 1); }, {x});
  check_grad("log_softmax dim 0", [](auto& in) { return log_softmax(in[0], 0); }, {x});
  check_grad("log_softmax dim -1", [](auto& in) { return log_softmax(in[0], -1); }, {x});
  check_grad("softmax of a transposed view", [](auto& in) { return softmax(in[0].t(), 1); }, {xt});
  check_grad("log_softmax of a transposed view", [](auto& in) { return log_softmax(in[0].t(), 0); },
             {xt});
  check_grad("relu of a transposed view", [](auto& in) { return relu(in[0].t()); }, {x});
  Tensor x3 = random_input({2, 3, 4}, 3);
  check_grad("softmax 3-D middle dim", [](auto& in) { return softmax(in[0], 1); }, {x3});
  check_grad("log_softmax 3-D dim 0", [](auto& in) { return log_softmax(in[0], 0); }, {x3});
}

TEST_CASE("softmax of a 0-dim tensor", "[runtime][ops][activation]") {
  Tensor s = Tensor::scalar(3.0, DType::f64);
  s.requires_grad_();
  Tensor y = softmax(s, 0);
  CHECK(y.shape().empty());
  CHECK(y.item() == 1.0);
  CHECK(log_softmax(s, -1).item() == 0.0);
  y.backward();  // reduces over dim 0 of a 0-dim tensor
  CHECK(s.grad().item() == 0.0);
}

TEST_CASE("relu and sigmoid gradients have the right values", "[runtime][ops][activation]") {
  Tensor x = Tensor::from_vector<double>({-1, 0, 2}, {3});
  x.requires_grad_();
  sum(relu(x)).backward();
  CHECK(values(x.grad()) == std::vector<double>{0, 0, 1});  // 0 at the kink, as PyTorch
  x.set_grad(Tensor());
  sum(sigmoid(x)).backward();
  auto g = values(x.grad());
  for (int i = 0; i < 3; ++i) {
    const double s = 1 / (1 + std::exp(-values(x)[i]));
    CHECK(g[i] == Approx(s * (1 - s)));
  }
}

TEST_CASE("relu passes NaN through, forward and backward, as PyTorch does",
          "[runtime][ops][activation]") {
  Tensor x = Tensor::from_vector<float>({std::nanf(""), -1.0f, 2.0f, 0.0f}, {4});
  x.requires_grad_();
  Tensor y = relu(x);
  const auto out = y.to_vector<float>();
  CHECK(std::isnan(out[0]));
  CHECK(out[1] == 0.0f);
  CHECK(out[2] == 2.0f);
  CHECK(out[3] == 0.0f);
  y.backward(Tensor::from_vector<float>({5.0f, 5.0f, 5.0f, 5.0f}, {4}));
  // threshold_backward: the gradient passes where the output is not <= 0.
  CHECK(x.grad().to_vector<float>() == std::vector<float>{5.0f, 0.0f, 5.0f, 0.0f});
}

TEST_CASE("gelu on f32: forward and backward near the f64 formula, a value's result the same "
          "wherever it sits, in each vector variant",
          "[runtime][ops][activation]") {
  for (const auto isa : lockstep::testing::vector_isa_variants()) {
    INFO(lockstep::runtime::cpu::to_string(isa));
    const lockstep::testing::ScopedVectorIsa use(isa);
    // -10 to 10 by 1/64: both tails, the seam of erf's two pieces (x / sqrt(2)
    // = 0.921875 at x = 1.3037), and 1281 values, so the last block is short.
    std::vector<float> xs;
    for (int i = -640; i <= 640; ++i) xs.push_back(static_cast<float>(i) / 64);
    Tensor x = Tensor::from_vector<float>(xs, {static_cast<int64_t>(xs.size())});
    x.requires_grad_();
    Tensor y = gelu(x);
    y.backward(Tensor::ones(y.shape(), DType::f32));
    const auto out = y.to_vector<float>(), grad = x.grad().to_vector<float>();
    for (size_t i = 0; i < xs.size(); ++i) {
      const double v = xs[i], cdf = 0.5 * std::erfc(-v / std::sqrt(2.0));
      const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI);
      INFO("x = " << v);
      // 1 + erf cancels for x < 0: the error is absolute, in units of |x| 2^-24.
      CHECK(out[i] == Approx(v * cdf).margin(1.5e-7 * std::max(1.0, std::fabs(v))));
      CHECK(grad[i] == Approx(cdf + v * pdf).margin(3e-7 * std::max(1.0, std::fabs(v))));
    }
    // The same values one at a time (each alone in a short block) and shifted by
    // one: bit-identical results.
    for (size_t i = 0; i < xs.size(); i += 97)
      CHECK(gelu(Tensor::from_vector<float>({xs[i]}, {1})).to_vector<float>()[0] == out[i]);
    std::vector<float> shifted{0.0f};
    shifted.insert(shifted.end(), xs.begin(), xs.end());
    const auto out2 =
        gelu(Tensor::from_vector<float>(shifted, {static_cast<int64_t>(shifted.size())}))
            .to_vector<float>();
    for (size_t i = 0; i < xs.size(); ++i) REQUIRE(out2[i + 1] == out[i]);
    // Tails, infinities and NaN.
    const float inf = std::numeric_limits<float>::infinity();
    const auto edge =
        gelu(Tensor::from_vector<float>({-100.0f, 100.0f, -inf, inf, std::nanf("")}, {5}))
            .to_vector<float>();
    CHECK(edge[0] == 0.0f);
    CHECK(edge[1] == 100.0f);
    CHECK(edge[3] == inf);
    CHECK(std::isnan(edge[4]));
  }
}
