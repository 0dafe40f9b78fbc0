// max_pool2d, avg_pool2d, adaptive_avg_pool2d: hand-computed values, a naive
// reference, gradient checks, error messages.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "lockstep/runtime/ops/pool.h"
#include "lockstep/runtime/random.h"
#include "support/gradcheck.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

namespace {

// f64 input whose values are a shuffled 0.1 * (0, 1, 2, ...): no ties, and
// far apart compared with gradcheck's step, so the argmax never flips.
Tensor distinct_input(const Shape& shape, uint64_t seed) {
  const int64_t n = shape_numel(shape);
  Generator gen(seed);
  std::vector<int64_t> perm = randperm(n, gen);
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = 0.1 * static_cast<double>(perm[i]) - 0.05 * n;
  return Tensor::from_vector(v, shape).requires_grad_();
}

struct Window {
  int64_t kh, kw, sh, sw, ph, pw;
  Pool2dOptions options() const { return {{kh, kw}, {sh, sw}, {ph, pw}}; }
};

// Reference max / average pool over [planes, h, w] by the definition.
std::vector<double> naive_pool(const std::vector<double>& x, int64_t planes, int64_t h, int64_t w,
                               const Window& k, bool max) {
  const int64_t oh = (h + 2 * k.ph - k.kh) / k.sh + 1, ow = (w + 2 * k.pw - k.kw) / k.sw + 1;
  std::vector<double> y;
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        double best = -INFINITY, sum = 0;
        for (int64_t a = 0; a < k.kh; ++a)
          for (int64_t b = 0; b < k.kw; ++b) {
            const int64_t ih = i * k.sh - k.ph + a, iw = j * k.sw - k.pw + b;
            if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;  // padding: 0 for the sum
            const double v = x[(p * h + ih) * w + iw];
            best = std::max(best, v);
            sum += v;
          }
        y.push_back(max ? best : sum / static_cast<double>(k.kh * k.kw));
      }
  return y;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])));
  }
}

}  // namespace

TEST_CASE("max_pool2d: 2x2 by hand, gradient to the argmax", "[runtime][ops][pool]") {
  const DType dtype = GENERATE(DType::f32, DType::f64);
  // One 4x4 plane; windows: [1 5 | 2 0 ; 3 4 | 8 6] -> 5, 8 ...
  Tensor x = Tensor::from_vector<double>({1, 5, 2, 0,  //
                                          3, 4, 8, 6,  //
                                          -1, -2, 7, 9,  //
                                          -3, -4, 9.5, 1},
                                         {1, 1, 4, 4})
                 .to(dtype)
                 .requires_grad_();
  Tensor y = max_pool2d(x, {.kernel = {2, 2}});
  CHECK(y.shape() == Shape{1, 1, 2, 2});
  CHECK(y.to_vector<double>() == std::vector<double>{5, 8, -1, 9.5});
  y.backward(Tensor::from_vector<double>({1, 2, 3, 4}, {1, 1, 2, 2}).to(dtype));
  CHECK(x.grad().to_vector<double>() ==
        std::vector<double>{0, 1, 0, 0, 0, 0, 2, 0, 3, 0, 0, 0, 0, 0, 4, 0});
}

TEST_CASE("max_pool2d and avg_pool2d match a naive loop", "[runtime][ops][pool]") {
  const Window k = GENERATE(Window{2, 2, 2, 2, 0, 0}, Window{3, 3, 2, 2, 1, 1},
                            Window{3, 2, 1, 2, 0, 1}, Window{2, 2, 1, 1, 1, 0},
                            Window{4, 4, 3, 3, 2, 2});
  const DType dtype = GENERATE(DType::f32, DType::f64);
  INFO("kernel " << k.kh << "x" << k.kw << " stride " << k.sh << "," << k.sw << " pad " << k.ph
                 << "," << k.pw);
  Generator g(11);
  Tensor x = randn({2, 3, 7, 9}, dtype, g);
  const auto xv = x.to_vector<double>();
  const double tol = dtype == DType::f32 ? 1e-6 : 1e-14;
  check_close(max_pool2d(x, k.options()).to_vector<double>(), naive_pool(xv, 6, 7, 9, k, true),
              tol);
  check_close(avg_pool2d(x, k.options()).to_vector<double>(), naive_pool(xv, 6, 7, 9, k, false),
              tol);
  // [C, H, W] input works too.
  check_close(max_pool2d(x.select(0, 1), k.options()).to_vector<double>(),
              max_pool2d(x, k.options()).select(0, 1).to_vector<double>(), 0);
}

TEST_CASE("ceil_mode keeps a last partial window, as PyTorch", "[runtime][ops][pool]") {
  const DType dtype = GENERATE(DType::f32, DType::f64);
  // 5x5 by 2x2 windows: 3x3 out, the last row and column clipped to one input.
  std::vector<double> v(25);
  std::iota(v.begin(), v.end(), 0.0);
  Tensor x = Tensor::from_vector(v, {1, 1, 5, 5}).to(dtype).requires_grad_();
  const Pool2dOptions o{.kernel = {2, 2}, .ceil_mode = true};
  Tensor y = max_pool2d(x, o);
  REQUIRE(y.shape() == Shape{1, 1, 3, 3});
  CHECK(y.to_vector<double>() == std::vector<double>{6, 8, 9, 16, 18, 19, 21, 23, 24});
  y.backward(Tensor::ones({1, 1, 3, 3}, dtype));
  std::vector<double> gx(25, 0.0);
  for (int at : {6, 8, 9, 16, 18, 19, 21, 23, 24}) gx[at] = 1;
  CHECK(x.grad().to_vector<double>() == gx);
  // Average: a clipped window divides by its part inside the input.
  CHECK(avg_pool2d(x, o).to_vector<double>() ==
        std::vector<double>{3, 5, 6.5, 13, 15, 16.5, 20.5, 22.5, 24});
  CHECK(max_pool2d(x, {.kernel = {2, 2}}).shape() == Shape{1, 1, 2, 2});

  // 6x6, kernel 3, stride 2, padding 1: 4x4 out (3x3 without ceil_mode); the
  // last window starts at 5 (inside) and counts the padded row 6, not row 7.
  Tensor ones = Tensor::ones({1, 1, 6, 6}, dtype);
  const Pool2dOptions p{.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true};
  Tensor a = avg_pool2d(ones, p);
  REQUIRE(a.shape() == Shape{1, 1, 4, 4});
  const double t = 1.0 / 3, u = 2.0 / 3;
  std::vector<double> want{4.0 / 9, u, u, t, u, 1, 1, 0.5, u, 1, 1, 0.5, t, 0.5, 0.5, 0.25};
  check_close(a.to_vector<double>(), want, 1e-6);
  // A window that would start in the bottom / right padding is not added:
  // 5 rows, kernel 2, stride 2, padding 1 gives 3 rows, not 4.
  CHECK(max_pool2d(Tensor::zeros({1, 1, 5, 5}, dtype),
                   {.kernel = {2, 2}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true})
            .shape() == Shape{1, 1, 3, 3});
}

TEST_CASE("max_pool2d propagates NaN and ignores the padding", "[runtime][ops][pool]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = Tensor::from_vector<double>({1, nan, 3, 4}, {1, 1, 2, 2});
  CHECK(std::isnan(max_pool2d(x, {.kernel = {2, 2}}).item()));
  // All-negative input with padding: the padding must not contribute a 0.
  Tensor neg = Tensor::full({1, 1, 3, 3}, -5.0, DType::f64);
  auto y = max_pool2d(neg, {.kernel = {3, 3}, .stride = {1, 1}, .padding = {1, 1}});
  for (double v : y.to_vector<double>()) CHECK(v == -5.0);
}

TEST_CASE("max_pool2d 2x2: ties go to the first tap and NaN wins, on rows of many lanes",
          "[runtime][ops][pool]") {
  // Values from {0, 1, 2} make ties common; rows of 21 outputs cover whole
  // vector groups, an overlapping last group and groups with a NaN in them,
  // rows of 7 and 5 one group and the overlap, rows of 3 no group at all.
  const DType dtype = GENERATE(DType::f32, DType::f64);
  const int64_t ow = GENERATE(21, 7, 5, 3);
  INFO(ow << " outputs a row");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const int64_t planes = 3, h = 6, w = 2 * ow, oh = 3;
  Generator g(5);
  std::vector<double> xv = randn({planes * h * w}, DType::f64, g).to_vector<double>();
  for (double& v : xv) v = std::floor(std::abs(v) * 1.5);
  for (int64_t i : {7, 100, 101, 333, 600, 601, 602, 603})
    if (i < static_cast<int64_t>(xv.size())) xv[i] = nan;
  Tensor x = Tensor::from_vector(xv, {1, planes, h, w}).to(dtype).requires_grad_();
  Tensor y = max_pool2d(x, {.kernel = {2, 2}});
  std::vector<double> gy(planes * oh * ow);
  std::iota(gy.begin(), gy.end(), 1.0);
  y.backward(Tensor::from_vector(gy, y.shape()).to(dtype));
  const auto got = y.to_vector<double>(), grad = x.grad().to_vector<double>();
  std::vector<double> want_grad(xv.size(), 0.0);
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        // Taps in order (0,0) (0,1) (1,0) (1,1), PyTorch's rule: a later tap
        // takes over when it is larger or NaN (so the first maximum, the last NaN).
        int64_t at = -1;
        for (int64_t a = 0; a < 2; ++a)
          for (int64_t b = 0; b < 2; ++b) {
            const int64_t k = (p * h + 2 * i + a) * w + 2 * j + b;
            if (at < 0 || xv[k] > xv[at] || std::isnan(xv[k])) at = k;
          }
        const int64_t q = (p * oh + i) * ow + j;
        INFO("plane " << p << " output " << i << "," << j);
        if (std::isnan(xv[at])) CHECK(std::isnan(got[q]));
        else CHECK(got[q] == xv[at]);
        want_grad[at] += gy[q];
      }
  CHECK(grad == want_grad);
}

TEST_CASE("max_pool2d 2x2: a window of zeros of both signs gives its first one's sign",
          "[runtime][ops][pool]") {
  // 0.0 and -0.0 compare equal, so the maximum is the first of them, as the
  // gradient's tap; 1 / y tells them apart (inf or -inf).
  const DType dtype = GENERATE(DType::f32, DType::f64);
  const int64_t ow = GENERATE(9, 3);  // vector groups and the scalar loop
  const int64_t h = 2, w = 2 * ow;
  std::vector<double> xv(h * w);
  for (int64_t j = 0; j < ow; ++j) {
    // Windows in order of taps (0,0) (0,1) (1,0) (1,1): + - - -, + - + -, - + - -, ...
    const int64_t first_positive = j % 4;
    for (int64_t k = 0; k < 4; ++k)
      xv[(k / 2) * w + 2 * j + k % 2] = k == first_positive ? 0.0 : -0.0;
  }
  Tensor x = Tensor::from_vector(xv, {1, 1, h, w}).to(dtype).requires_grad_();
  Tensor y = max_pool2d(x, {.kernel = {2, 2}});
  y.backward(Tensor::ones(y.shape(), dtype));
  const auto got = y.to_vector<double>(), grad = x.grad().to_vector<double>();
  for (int64_t j = 0; j < ow; ++j) {
    INFO("window " << j);
    const int64_t first = 2 * j;  // tap (0,0): every window's first zero
    CHECK(std::signbit(got[j]) == std::signbit(xv[first]));
    CHECK(grad[first] == 1.0);
  }
}

TEST_CASE("avg_pool2d counts the padding in the divisor", "[runtime][ops][pool]") {
  // 2x2 input of ones, kernel 2, stride 1, pad 1 -> 3x3 output; the corner
  // windows cover one real element of four, the edge ones two.
  Tensor x = Tensor::ones({1, 1, 2, 2}, DType::f64);
  Tensor y = avg_pool2d(x, {.kernel = {2, 2}, .stride = {1, 1}, .padding = {1, 1}});
  CHECK(y.to_vector<double>() ==
        std::vector<double>{0.25, 0.5, 0.25, 0.5, 1.0, 0.5, 0.25, 0.5, 0.25});
}

TEST_CASE("adaptive_avg_pool2d uses PyTorch's window formula", "[runtime][ops][pool]") {
  // 1x5 -> 1x3: windows [0,2), [1,4), [3,5) (start floor(i*5/3), end ceil((i+1)*5/3)).
  Tensor x = Tensor::from_vector<double>({1, 2, 3, 4, 5}, {1, 1, 1, 5});
  CHECK(adaptive_avg_pool2d(x, {1, 3}).to_vector<double>() == std::vector<double>{1.5, 3, 4.5});
  // 1x1 output is the mean of the plane; larger output than input repeats values.
  Generator g(2);
  Tensor r = randn({2, 3, 5, 7}, DType::f64, g);
  auto means = adaptive_avg_pool2d(r, {1, 1}).to_vector<double>();
  auto rv = r.to_vector<double>();
  for (int p = 0; p < 6; ++p) {
    double s = 0;
    for (int i = 0; i < 35; ++i) s += rv[p * 35 + i];
    CHECK(means[p] == Approx(s / 35).epsilon(1e-12));
  }
  Tensor up = adaptive_avg_pool2d(Tensor::from_vector<double>({1, 2}, {1, 1, 1, 2}), {2, 4});
  CHECK(up.to_vector<double>() == std::vector<double>{1, 1, 2, 2, 1, 1, 2, 2});
}

TEST_CASE("pooling gradcheck", "[runtime][ops][pool][gradcheck]") {
  const Window k = GENERATE(Window{2, 2, 2, 2, 0, 0}, Window{3, 3, 2, 2, 1, 1},
                            Window{3, 2, 1, 2, 0, 1}, Window{2, 2, 1, 1, 1, 1});
  INFO("kernel " << k.kh << "x" << k.kw);
  check_grad("max", [&](const std::vector<Tensor>& t) { return max_pool2d(t[0], k.options()); },
             {distinct_input({2, 2, 6, 7}, 4)});
  check_grad("avg", [&](const std::vector<Tensor>& t) { return avg_pool2d(t[0], k.options()); },
             {random_input({2, 2, 6, 7}, 5)});
}

TEST_CASE("pooling gradcheck with ceil_mode", "[runtime][ops][pool][gradcheck]") {
  const Window k = GENERATE(Window{2, 2, 2, 2, 0, 0}, Window{3, 3, 2, 2, 1, 1},
                            Window{3, 2, 2, 3, 0, 1});
  INFO("kernel " << k.kh << "x" << k.kw);
  Pool2dOptions o = k.options();
  o.ceil_mode = true;
  check_grad("max", [&](const std::vector<Tensor>& t) { return max_pool2d(t[0], o); },
             {distinct_input({2, 2, 6, 7}, 4)});
  check_grad("avg", [&](const std::vector<Tensor>& t) { return avg_pool2d(t[0], o); },
             {random_input({2, 2, 6, 7}, 5)});
}

TEST_CASE("adaptive_avg_pool2d gradcheck", "[runtime][ops][pool][gradcheck]") {
  const auto out = GENERATE(std::array<int64_t, 2>{3, 2}, std::array<int64_t, 2>{1, 1},
                            std::array<int64_t, 2>{7, 9});
  auto r = gradcheck(
      [&](const std::vector<Tensor>& t) { return adaptive_avg_pool2d(t[0], out); },
      {random_input({2, 2, 5, 7}, 6)});
  INFO(r.message);
  CHECK(r.ok);
}

TEST_CASE("pooling rejects bad arguments with clear messages", "[runtime][ops][pool]") {
  Tensor x = Tensor::zeros({1, 2, 4, 4});
  CHECK_THAT(error_of([&] { max_pool2d(Tensor::zeros({4, 4}), {}); }),
             Contains("max_pool2d: expected input [N, C, H, W] or [C, H, W]"));
  CHECK_THAT(error_of([&] { max_pool2d(x, {.kernel = {2, 2}, .padding = {2, 0}}); }),
             Contains("at most half the kernel"));
  CHECK_THAT(error_of([&] { avg_pool2d(x, {.kernel = {5, 5}}); }),
             Contains("smaller than the kernel"));
  CHECK_THAT(error_of([&] { avg_pool2d(x, {.kernel = {0, 2}}); }),
             Contains("kernel and stride must be positive"));
  CHECK_THAT(error_of([&] { adaptive_avg_pool2d(x, {0, 2}); }),
             Contains("output size must be positive"));
  CHECK_THAT(error_of([&] { max_pool2d(x.to(DType::i64), {}); }), Contains("f32 or f64"));
}
