// batch_norm and layer_norm: values against a direct computation, running
// statistics, gradient checks, error messages.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/norm.h"
#include "lockstep/runtime/ops/reduce.h"
#include "lockstep/runtime/random.h"
#include "support/gradcheck.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

namespace {

// Per-channel mean and biased variance of x viewed as [n, c, inner].
void channel_moments(const std::vector<double>& x, int64_t n, int64_t c, int64_t inner,
                     std::vector<double>& mean, std::vector<double>& var) {
  mean.assign(c, 0.0);
  var.assign(c, 0.0);
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < inner; ++k) mean[ch] += x[(i * c + ch) * inner + k];
    mean[ch] /= static_cast<double>(n * inner);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < inner; ++k) {
        const double d = x[(i * c + ch) * inner + k] - mean[ch];
        var[ch] += d * d;
      }
    var[ch] /= static_cast<double>(n * inner);
  }
}

}  // namespace

TEST_CASE("batch_norm training: batch statistics and running-stat update",
          "[runtime][ops][norm]") {
  const Shape shape = GENERATE(Shape{6, 3}, Shape{4, 3, 5}, Shape{2, 3, 4, 5});
  const DType dtype = GENERATE(DType::f32, DType::f64);
  INFO(shape_str(shape) << " " << dtype_name(dtype));
  Generator g(1);
  Tensor x = randn(shape, dtype, g);
  x = (x * 2.0 + 3.0).detach();
  Tensor w = randn({3}, dtype, g), b = randn({3}, dtype, g);
  Tensor rm = Tensor::from_vector<double>({0.5, -1.0, 2.0}, {3}).to(dtype);
  Tensor rv = Tensor::from_vector<double>({1.5, 0.5, 2.0}, {3}).to(dtype);
  const auto rm0 = rm.to_vector<double>(), rv0 = rv.to_vector<double>();
  const uint64_t rm_version = rm.version();
  const double momentum = 0.3, eps = 1e-5;
  Tensor y = batch_norm(x, w, b, rm, rv, true, momentum, eps);

  const int64_t n = shape[0], inner = x.numel() / (n * 3);
  std::vector<double> mean, var;
  const auto xv = x.to_vector<double>(), wv = w.to_vector<double>(), bv = b.to_vector<double>();
  channel_moments(xv, n, 3, inner, mean, var);
  const auto yv = y.to_vector<double>();
  const double tol = dtype == DType::f32 ? 1e-5 : 1e-12;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t k = 0; k < inner; ++k) {
        const int64_t at = (i * 3 + c) * inner + k;
        const double want = (xv[at] - mean[c]) / std::sqrt(var[c] + eps) * wv[c] + bv[c];
        CHECK(yv[at] == Approx(want).margin(tol * 10).epsilon(tol));
      }
  // running = (1 - m) * running + m * stat, with the unbiased variance.
  const double m = static_cast<double>(n * inner);
  const auto rm1 = rm.to_vector<double>(), rv1 = rv.to_vector<double>();
  for (int c = 0; c < 3; ++c) {
    CHECK(rm1[c] == Approx((1 - momentum) * rm0[c] + momentum * mean[c]).epsilon(tol));
    CHECK(rv1[c] ==
          Approx((1 - momentum) * rv0[c] + momentum * var[c] * m / (m - 1)).epsilon(tol));
  }
  CHECK(rm.version() > rm_version);  // the in-place update is visible to autograd's checks
  CHECK_FALSE(rm.requires_grad());
}

TEST_CASE("batch_norm eval normalises with the running statistics", "[runtime][ops][norm]") {
  const DType dtype = GENERATE(DType::f32, DType::f64);
  Generator g(2);
  Tensor x = randn({4, 2, 3}, dtype, g);
  Tensor rm = Tensor::from_vector<double>({0.25, -0.5}, {2}).to(dtype);
  Tensor rv = Tensor::from_vector<double>({2.0, 0.5}, {2}).to(dtype);
  Tensor y = batch_norm(x, {}, {}, rm, rv, false, 0.1, 1e-3);
  const auto xv = x.to_vector<double>(), yv = y.to_vector<double>();
  const double means[2] = {0.25, -0.5}, vars[2] = {2.0, 0.5};
  for (size_t i = 0; i < xv.size(); ++i) {
    const int c = static_cast<int>((i / 3) % 2);
    CHECK(yv[i] == Approx((xv[i] - means[c]) / std::sqrt(vars[c] + 1e-3)).epsilon(1e-5));
  }
  // Eval leaves the running statistics alone.
  CHECK(rm.to_vector<double>() == std::vector<double>{0.25, -0.5});
}

TEST_CASE("batch_norm statistics stay accurate for a large mean", "[runtime][ops][norm]") {
  // f32 values around 1000 with std 0.01: E[x^2] - E[x]^2 would lose every digit.
  Generator g(3);
  Tensor x = (randn({64, 2, 50}, DType::f64, g) * 0.01 + 1000.0).to(DType::f32).detach();
  Tensor rm = Tensor::zeros({2}), rv = Tensor::ones({2});
  batch_norm(x, {}, {}, rm, rv, true, 1.0, 1e-5);
  std::vector<double> mean, var;
  channel_moments(x.to_vector<double>(), 64, 2, 50, mean, var);
  const double unbias = 3200.0 / 3199.0;
  CHECK(rv.to_vector<double>()[0] == Approx(var[0] * unbias).epsilon(1e-3));
  CHECK(rv.to_vector<double>()[1] == Approx(var[1] * unbias).epsilon(1e-3));
}

TEST_CASE("batch_norm and layer_norm take a constant input to exactly 0 before the bias, as "
          "PyTorch", "[runtime][ops][norm]") {
  // The shift used to be rounded from the double product mean * invstd while
  // x * scale rounded on its own: a constant 1000 normalised to -0.03125.
  const double c = GENERATE(3.0, 1000.0, -7.5);
  const DType dt = GENERATE(DType::f32, DType::f64);
  INFO("constant " << c << ", " << dtype_name(dt));
  Tensor x = Tensor::full({2, 8}, c, dt);
  Tensor w = Tensor::full({8}, 2.0, dt), b = Tensor::full({8}, 0.5, dt);
  w.requires_grad_();
  Tensor y = layer_norm(x, {8}, w, b, 1e-5);
  CHECK(values(y) == std::vector<double>(16, 0.5));
  sum(mul(y, iota({2, 8}, dt))).backward();
  CHECK(values(w.grad()) == std::vector<double>(8, 0.0));

  Tensor xb = Tensor::full({4, 2, 3, 3}, c, dt);
  Tensor wb = Tensor::full({2}, 2.0, dt);
  CHECK(values(batch_norm(xb, wb, {}, {}, {}, true, 0.1, 1e-5)) == std::vector<double>(72, 0.0));
  // Eval at the running mean, whatever the running variance.
  Tensor rm = Tensor::full({2}, c, dt), rv = Tensor::full({2}, 0.3, dt);
  CHECK(values(batch_norm(xb, wb, {}, rm, rv, false, 0.1, 1e-5)) ==
        std::vector<double>(72, 0.0));
}

TEST_CASE("batch_norm gradcheck: training and eval, with and without affine",
          "[runtime][ops][norm][gradcheck]") {
  const bool training = GENERATE(true, false);
  const bool affine = GENERATE(true, false);
  const Shape shape = GENERATE(Shape{5, 3}, Shape{3, 3, 2, 4});
  INFO("training " << training << " affine " << affine << " " << shape_str(shape));
  Tensor rm = Tensor::from_vector<double>({0.1, -0.2, 0.3}, {3});
  Tensor rv = Tensor::from_vector<double>({0.8, 1.2, 0.6}, {3});
  std::vector<Tensor> in{random_input(shape, 1)};
  if (affine) in.push_back(random_input({3}, 2)), in.push_back(random_input({3}, 3));
  auto r = gradcheck(
      [&](const std::vector<Tensor>& t) {
        return batch_norm(t[0], affine ? t[1] : Tensor(), affine ? t[2] : Tensor(), rm, rv,
                          training, 0.1, 1e-5);
      },
      in);
  INFO(r.message);
  CHECK(r.ok);
}

TEST_CASE("batch_norm rejects bad arguments", "[runtime][ops][norm]") {
  Tensor x = Tensor::zeros({4, 3, 2});
  CHECK_THAT(error_of([&] { batch_norm(Tensor::zeros({4}), {}, {}, {}, {}, true); }),
             Contains("expected input [N, C] or [N, C, ...], got [4]"));
  CHECK_THAT(error_of([&] { batch_norm(x, Tensor::ones({4}), {}, {}, {}, true); }),
             Contains("expected weight of shape [3]"));
  CHECK_THAT(error_of([&] { batch_norm(x, {}, {}, {}, {}, false); }),
             Contains("eval mode normalises with the running statistics"));
  CHECK_THAT(error_of([&] { batch_norm(Tensor::zeros({1, 3}), {}, {}, {}, {}, true); }),
             Contains("more than 1 value per channel"));
}

TEST_CASE("batch_norm in eval refuses running statistics that require grad, as PyTorch does",
          "[runtime][ops][norm]") {
  // Eval normalises with them but read them as constants: their gradient was
  // silently zero.
  const Tensor x = random_input({4, 3}, 1);
  Tensor rm = random_input({3}, 2), rv = random_input({3}, 3, 0.5, 1.5);
  const bool mean_requires_grad = GENERATE(true, false);
  (mean_requires_grad ? rv : rm).requires_grad_(false);
  CHECK_THAT(error_of([&] { batch_norm(x, {}, {}, rm, rv, false); }),
             Contains("in eval mode the running statistics get no gradient"));
  {
    NoGradGuard no_grad;  // nothing is recorded, so nothing is lost
    CHECK(batch_norm(x, {}, {}, rm, rv, false).shape() == x.shape());
  }
}

TEST_CASE("layer_norm forward matches a direct computation", "[runtime][ops][norm]") {
  const DType dtype = GENERATE(DType::f32, DType::f64);
  const bool affine = GENERATE(true, false);
  Generator g(4);
  Tensor x = randn({3, 2, 4, 5}, dtype, g);
  Tensor w = affine ? randn({4, 5}, dtype, g) : Tensor();
  Tensor b = affine ? randn({4, 5}, dtype, g) : Tensor();
  Tensor y = layer_norm(x, {4, 5}, w, b, 1e-5);
  const auto xv = x.to_vector<double>(), yv = y.to_vector<double>();
  const auto wv = affine ? w.to_vector<double>() : std::vector<double>(20, 1.0);
  const auto bv = affine ? b.to_vector<double>() : std::vector<double>(20, 0.0);
  const double tol = dtype == DType::f32 ? 1e-5 : 1e-12;
  for (int r = 0; r < 6; ++r) {
    double mean = 0, var = 0;
    for (int i = 0; i < 20; ++i) mean += xv[r * 20 + i] / 20;
    for (int i = 0; i < 20; ++i) var += (xv[r * 20 + i] - mean) * (xv[r * 20 + i] - mean) / 20;
    for (int i = 0; i < 20; ++i) {
      const double want = (xv[r * 20 + i] - mean) / std::sqrt(var + 1e-5) * wv[i] + bv[i];
      CHECK(yv[r * 20 + i] == Approx(want).margin(tol * 10).epsilon(tol));
    }
  }
}

TEST_CASE("layer_norm gradcheck with and without affine", "[runtime][ops][norm][gradcheck]") {
  const bool affine = GENERATE(true, false);
  const std::vector<int64_t> norm_shape = GENERATE(std::vector<int64_t>{6},
                                                   std::vector<int64_t>{2, 3});
  std::vector<Tensor> in{random_input({4, 2, 3}, 1)};
  if (norm_shape.size() == 1) in[0] = random_input({4, 6}, 1);
  if (affine) in.push_back(random_input(norm_shape, 2)), in.push_back(random_input(norm_shape, 3));
  auto r = gradcheck(
      [&](const std::vector<Tensor>& t) {
        return layer_norm(t[0], norm_shape, affine ? t[1] : Tensor(), affine ? t[2] : Tensor());
      },
      in);
  INFO(r.message);
  CHECK(r.ok);
}

TEST_CASE("layer_norm rejects a shape that does not match", "[runtime][ops][norm]") {
  Tensor x = Tensor::zeros({2, 3, 4});
  CHECK_THAT(error_of([&] { layer_norm(x, {3}); }),
             Contains("normalized_shape [3] must be non-empty and match the trailing dims of "
                      "the input [2, 3, 4]"));
  CHECK_THAT(error_of([&] { layer_norm(x, {4}, Tensor::ones({5})); }),
             Contains("expected weight of shape [4]"));
}

TEST_CASE("batch_norm and layer_norm refuse 16-bit parameters for a wider input",
          "[runtime][ops][norm]") {
  // Rounding the f32 input's result to the weight's bf16 would be a silent loss.
  Tensor x = Tensor::ones({2, 4});
  Tensor w = Tensor::ones({4}, DType::bf16), b = Tensor::zeros({4}, DType::bf16);
  CHECK_THAT(error_of([&] { layer_norm(x, {4}, w, b); }),
             Contains("input is f32 but weight is bf16"));
  CHECK_THAT(error_of([&] { batch_norm(x, {}, b, {}, {}, true); }),
             Contains("input is f32 but bias is bf16"));
  // A 16-bit input with f32 parameters still runs in f32 and gives the input's dtype.
  Tensor low = Tensor::ones({2, 4}, DType::bf16);
  CHECK(layer_norm(low, {4}, w.to(DType::f32), b.to(DType::f32)).dtype() == DType::bf16);
  CHECK(batch_norm(low, w.to(DType::f32), {}, {}, {}, true).dtype() == DType::bf16);
}
