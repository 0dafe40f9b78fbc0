// nn layers: PyTorch's default initialisations, forward against the runtime
// ops or hand-computed values, options and error messages.
#include <catch2/catch.hpp>

#include <cmath>

#include "lockstep/nn/nn.h"
#include "lockstep/runtime/ops.h"
#include "support/test_util.h"

using namespace lockstep::nn;
using namespace lockstep::testing;
using Catch::Contains;

namespace {

struct Stats {
  double min, max, mean, var;
};

Stats stats(const Tensor& t) {
  auto v = values(t);
  Stats s{v[0], v[0], 0, 0};
  for (double x : v) {
    s.min = std::min(s.min, x);
    s.max = std::max(s.max, x);
    s.mean += x;
  }
  s.mean /= static_cast<double>(v.size());
  for (double x : v) s.var += (x - s.mean) * (x - s.mean);
  s.var /= static_cast<double>(v.size());
  return s;
}

// U(-b, b) has mean 0 and variance b^2/3. The mean and variance checks allow
// five standard errors of their estimates over n draws.
void check_uniform(const Tensor& t, double bound) {
  Stats s = stats(t);
  const double n = static_cast<double>(t.numel());
  CHECK(s.min >= -bound);
  CHECK(s.max <= bound);
  CHECK(s.max > 0.95 * bound);  // the whole range is used, not a narrower one
  CHECK(s.min < -0.95 * bound);
  CHECK(std::abs(s.mean) < 5 * bound / std::sqrt(3 * n));
  // Var(x^2) = b^4/5 - b^4/9 = 4 b^4 / 45.
  CHECK(std::abs(s.var - bound * bound / 3) < 5 * bound * bound * std::sqrt(4.0 / 45 / n));
}

}  // namespace

TEST_CASE("Linear with no inputs: the initialisers leave its empty weight alone, as PyTorch's",
          "[nn][layers]") {
  // fan_in 0: kaiming's bound would be infinite, a range uniform_ refuses.
  Generator gen(0);
  Linear empty(0, 3, true, gen);
  CHECK(empty.weight.shape() == Shape{3, 0});
  CHECK(values(empty.bias) == std::vector<double>(3, 0.0));
  CHECK(values(empty(Tensor::zeros({2, 0}))) == std::vector<double>(6, 0.0));
  for (auto init : {&lockstep::runtime::kaiming_normal_, &lockstep::runtime::xavier_uniform_,
                    &lockstep::runtime::xavier_normal_}) {
    Tensor w = Tensor::empty({3, 0});
    CHECK(error_of([&] { init(w, 1.0, gen); }) == "<no exception>");
  }
}

TEST_CASE("Linear: PyTorch's default init and forward", "[nn][layers]") {
  Generator gen(0);
  Linear fc(400, 300, true, gen);
  CHECK(fc.weight.shape() == Shape{300, 400});
  CHECK(fc.bias.shape() == Shape{300});
  // kaiming_uniform(a = sqrt(5)): gain sqrt(2/(1+5)), bound gain*sqrt(3/fan_in) = 1/sqrt(fan_in).
  check_uniform(fc.weight, 1.0 / std::sqrt(400.0));
  check_uniform(fc.bias, 1.0 / std::sqrt(400.0));

  Linear small(3, 2);
  small.load_state_dict([] {
    StateDict sd;
    sd.insert("weight", Tensor::from_vector<float>({1, 2, 3, -1, 0, 1}, {2, 3}));
    sd.insert("bias", Tensor::from_vector<float>({0.5, -0.5}, {2}));
    return sd;
  }());
  Tensor x = Tensor::from_vector<float>({1, 1, 1, 2, 0, -1}, {2, 3});
  CHECK(values(small(x)) == std::vector<double>{6.5, -0.5, -0.5, -3.5});

  Linear no_bias(3, 2, false);
  CHECK_FALSE(no_bias.bias.defined());
  CHECK(no_bias.named_parameters().size() == 1);
  CHECK_THAT(error_of([&] { small(Tensor::zeros({2, 4})); }),
             Contains("input of shape [2, 4] must end in 3"));
}

TEST_CASE("same seed gives identical parameters, another seed different ones", "[nn][layers]") {
  Generator g1(42), g2(42), g3(43);
  Conv2d a(3, 8, 3, {}, g1), b(3, 8, 3, {}, g2), c(3, 8, 3, {}, g3);
  CHECK(bitwise_equal(a.weight, b.weight));
  CHECK(bitwise_equal(a.bias, b.bias));
  CHECK_FALSE(bitwise_equal(a.weight, c.weight));
  // Layers built one after the other from one generator continue its stream.
  Generator g(7);
  Linear first(4, 4, true, g), second(4, 4, true, g);
  CHECK_FALSE(bitwise_equal(first.weight, second.weight));
}

TEST_CASE("Conv2d: init bound uses in_channels/groups * kH * kW; options", "[nn][layers]") {
  Generator gen(1);
  Conv2d conv(16, 64, {3, 5}, {.stride = 2, .padding = {1, 2}, .groups = 4}, gen);
  CHECK(conv.weight.shape() == Shape{64, 4, 3, 5});
  const double bound = 1.0 / std::sqrt(4.0 * 3 * 5);
  check_uniform(conv.weight, bound);
  CHECK(stats(conv.bias).max <= bound);

  Generator g(2);
  Tensor x = lockstep::runtime::randn({2, 16, 9, 10}, DType::f32, g);
  Tensor y = conv(x);
  CHECK(y.shape() == Shape{2, 64, 5, 5});
  Tensor expect = lockstep::runtime::conv2d(
      x, conv.weight, conv.bias, {.stride = {2, 2}, .padding = {1, 2}, .groups = 4});
  CHECK(bitwise_equal(y, expect));

  Conv2d dil(1, 1, 3, {.dilation = 2, .bias = false});
  CHECK_FALSE(dil.bias.defined());
  CHECK(dil(Tensor::zeros({1, 1, 7, 7})).shape() == Shape{1, 1, 3, 3});
  CHECK(dil.str() == "Conv2d(1, 1, kernel_size=(3, 3), stride=(1, 1), dilation=(2, 2), bias=false)");

  CHECK_THAT(error_of([] { Conv2d(6, 4, 3, {.groups = 4}); }),
             Contains("divisible by groups (4)"));
  CHECK_THAT(error_of([&] { conv(Tensor::zeros({2, 3, 9, 9})); }),
             Contains("expected input [N, 16, H, W], got [2, 3, 9, 9]"));
}

TEST_CASE("BatchNorm: init, running statistics, momentum and options", "[nn][layers]") {
  BatchNorm2d bn(3);
  CHECK(values(bn.weight) == std::vector<double>{1, 1, 1});
  CHECK(values(bn.bias) == std::vector<double>{0, 0, 0});
  CHECK(values(bn.running_mean) == std::vector<double>{0, 0, 0});
  CHECK(values(bn.running_var) == std::vector<double>{1, 1, 1});
  CHECK(bn.num_batches_tracked.dtype() == DType::i64);
  CHECK(bn.num_batches_tracked.dim() == 0);

  // Channel c holds the values c + {0, 2} (mean c + 1, unbiased variance 2).
  Tensor x = Tensor::from_vector<float>({0, 1, 2, 2, 3, 4}, {2, 3, 1, 1});
  Tensor y = bn(x);
  CHECK(bn.num_batches_tracked.item() == 1);
  auto rm = values(bn.running_mean);
  auto rv = values(bn.running_var);
  for (int c = 0; c < 3; ++c) {
    CHECK(rm[c] == Approx(0.1 * (c + 1)));
    CHECK(rv[c] == Approx(0.9 + 0.1 * 2));
  }
  // Batch statistics: each channel becomes (-1, 1) (up to eps).
  auto yv = values(y);
  CHECK(yv[0] == Approx(-1).epsilon(1e-4));
  CHECK(yv[3] == Approx(1).epsilon(1e-4));

  // momentum = nullopt: the cumulative average over the batches seen.
  BatchNorm1d avg(1, {.momentum = std::nullopt});
  avg(Tensor::from_vector<float>({1, 3}, {2, 1}));
  avg(Tensor::from_vector<float>({5, 7}, {2, 1}));
  CHECK(values(avg.running_mean)[0] == Approx(4.0));
  CHECK(avg.str() ==
        "BatchNorm1d(1, eps=1e-05, momentum=None, affine=true, track_running_stats=true)");

  // No running statistics: no buffers, and batch statistics in eval too.
  BatchNorm1d plain(2, {.affine = false, .track_running_stats = false});
  CHECK(plain.state_dict().size() == 0);
  plain.eval();
  Tensor z = plain(Tensor::from_vector<float>({1, 10, 3, 30}, {2, 2}));
  CHECK(values(z)[0] == Approx(-1).epsilon(1e-4));

  CHECK_THAT(error_of([&] { bn(Tensor::zeros({2, 3})); }),
             Contains("expected 4D input (got 2D input)"));
  CHECK_THAT(error_of([&] { bn(Tensor::zeros({2, 4, 1, 1})); }), Contains("has 4 channels"));
  CHECK_THAT(error_of([&] { avg(Tensor::zeros({2, 1, 1, 1})); }),
             Contains("expected 2D or 3D input (got 4D input)"));

  bn.reset_running_stats();
  CHECK(values(bn.running_mean) == std::vector<double>{0, 0, 0});
  CHECK(bn.num_batches_tracked.item() == 0);
}

TEST_CASE("BatchNorm: a refused training batch is not counted and the cumulative average "
          "stays exact",
          "[nn][layers]") {
  // momentum = nullopt weighs batch k by 1/num_batches_tracked: a refused
  // forward that still counted would leave every later average wrong.
  BatchNorm1d avg(1, {.momentum = std::nullopt});
  avg(Tensor::from_vector<float>({1, 3}, {2, 1}));  // mean 2, unbiased var 2
  CHECK_THAT(error_of([&] { avg(Tensor::from_vector<float>({100}, {1, 1})); }),
             Contains("more than 1 value per channel"));
  CHECK_THAT(error_of([&] { avg(Tensor::from_vector<double>({100, 200}, {2, 1})); }),
             Contains("input is f64 but weight is f32"));
  CHECK(avg.num_batches_tracked.item() == 1);
  avg(Tensor::from_vector<float>({5, 9}, {2, 1}));  // mean 7, unbiased var 8
  CHECK(avg.num_batches_tracked.item() == 2);
  CHECK(values(avg.running_mean)[0] == Approx((2.0 + 7.0) / 2));
  CHECK(values(avg.running_var)[0] == Approx((2.0 + 8.0) / 2));
}

TEST_CASE("LayerNorm and Embedding init", "[nn][layers]") {
  LayerNorm ln({4});
  CHECK(values(ln.weight) == std::vector<double>(4, 1.0));
  CHECK(values(ln.bias) == std::vector<double>(4, 0.0));
  Tensor y = ln(Tensor::from_vector<float>({1, 2, 3, 4}, {1, 4}));
  CHECK(stats(y).mean == Approx(0).margin(1e-6));
  CHECK(LayerNorm({4}, 1e-5, false).named_parameters().empty());
  CHECK(ln.str() == "LayerNorm((4,), eps=1e-05, elementwise_affine=true)");

  Generator gen(5);
  Embedding emb(1000, 64, gen);
  Stats s = stats(emb.weight);
  CHECK(std::abs(s.mean) < 0.02);
  CHECK(s.var == Approx(1.0).epsilon(0.03));
  Tensor idx = Tensor::from_vector<int64_t>({3, 999, 3}, {3});
  Tensor e = emb(idx);
  CHECK(e.shape() == Shape{3, 64});
  CHECK(bitwise_equal(e.select(0, 0), emb.weight.select(0, 3)));
  CHECK(bitwise_equal(e.select(0, 2), emb.weight.select(0, 3)));
}

namespace {

// Direct convolution of one-batch, one-group x [C, H, W] by w [O, C, kH, kW],
// stride 1, padded by (top, left) and as much on the bottom / right as
// needed for an output [O, H, W]; and its input gradient for output grad gy.
struct SameConvRef {
  int64_t c, h, w, o, kh, kw, dh, dw, top, left;
  double x_at(const std::vector<double>& x, int64_t ci, int64_t p, int64_t q) const {
    return p < 0 || p >= h || q < 0 || q >= w ? 0.0 : x[(ci * h + p) * w + q];
  }
  std::vector<double> forward(const std::vector<double>& x, const std::vector<double>& wt) const {
    std::vector<double> y(o * h * w, 0.0);
    for (int64_t oi = 0; oi < o; ++oi)
      for (int64_t i = 0; i < h; ++i)
        for (int64_t j = 0; j < w; ++j)
          for (int64_t ci = 0; ci < c; ++ci)
            for (int64_t a = 0; a < kh; ++a)
              for (int64_t b = 0; b < kw; ++b)
                y[(oi * h + i) * w + j] += wt[((oi * c + ci) * kh + a) * kw + b] *
                                           x_at(x, ci, i - top + a * dh, j - left + b * dw);
    return y;
  }
  std::vector<double> grad_input(const std::vector<double>& gy,
                                 const std::vector<double>& wt) const {
    std::vector<double> gx(c * h * w, 0.0);
    for (int64_t oi = 0; oi < o; ++oi)
      for (int64_t i = 0; i < h; ++i)
        for (int64_t j = 0; j < w; ++j)
          for (int64_t ci = 0; ci < c; ++ci)
            for (int64_t a = 0; a < kh; ++a)
              for (int64_t b = 0; b < kw; ++b) {
                const int64_t p = i - top + a * dh, q = j - left + b * dw;
                if (p < 0 || p >= h || q < 0 || q >= w) continue;
                gx[(ci * h + p) * w + q] +=
                    gy[(oi * h + i) * w + j] * wt[((oi * c + ci) * kh + a) * kw + b];
              }
    return gx;
  }
};

}  // namespace

TEST_CASE("Conv2d padding=\"same\" keeps H and W, the odd zero on the bottom/right",
          "[nn][layers]") {
  struct Case {
    Size2 k, dilation;
  };
  // Even kernels (odd total padding), an odd kernel, and a dilated mix.
  const Case cs = GENERATE(Case{{2, 4}, 1}, Case{3, 1}, Case{{2, 3}, {3, 2}}, Case{{4, 1}, 1});
  INFO("kernel " << cs.k.str() << " dilation " << cs.dilation.str());
  Generator gen(3);
  Conv2d conv(2, 3, cs.k, {.padding = "same", .dilation = cs.dilation, .bias = false}, gen);
  const int64_t h = 5, w = 6;
  Tensor x = lockstep::runtime::randn({1, 2, h, w}, DType::f32, gen).requires_grad_();
  Tensor y = conv(x);
  REQUIRE(y.shape() == Shape{1, 3, h, w});
  const SameConvRef ref{2, h, w, 3, cs.k.h, cs.k.w, cs.dilation.h, cs.dilation.w,
                        cs.dilation.h * (cs.k.h - 1) / 2, cs.dilation.w * (cs.k.w - 1) / 2};
  const auto want = ref.forward(values(x), values(conv.weight));
  const auto got = values(y);
  for (size_t i = 0; i < want.size(); ++i) CHECK(got[i] == Approx(want[i]).margin(1e-5));
  Tensor gy = lockstep::runtime::randn({1, 3, h, w}, DType::f32, gen);
  y.backward(gy);
  const auto want_gx = ref.grad_input(values(gy), values(conv.weight));
  const auto got_gx = values(x.grad());
  REQUIRE(got_gx.size() == want_gx.size());
  for (size_t i = 0; i < want_gx.size(); ++i)
    CHECK(got_gx[i] == Approx(want_gx[i]).margin(1e-5));
}

TEST_CASE("Conv2d padding strings: \"valid\", printing and refusals", "[nn][layers]") {
  Conv2d valid(1, 2, 3, {.padding = "valid"});
  CHECK(valid(Tensor::zeros({1, 1, 7, 8})).shape() == Shape{1, 2, 5, 6});
  CHECK(valid.str() == "Conv2d(1, 2, kernel_size=(3, 3), stride=(1, 1), padding=valid)");
  Conv2d same(1, 2, 3, {.padding = "same"});
  CHECK(same.str() == "Conv2d(1, 2, kernel_size=(3, 3), stride=(1, 1), padding=same)");
  auto copy = std::dynamic_pointer_cast<Conv2d>(same.replicate());
  REQUIRE(copy);
  CHECK(copy->options.padding.mode == Conv2dPadding::Mode::same);
  CHECK_THAT(error_of([] { Conv2d(1, 2, 3, {.stride = 2, .padding = "same"}); }),
             Contains("padding=\"same\" needs stride 1, got stride (2, 2)"));
  CHECK_THAT(error_of([] { Conv2d(1, 2, 3, {.padding = "full"}); }),
             Contains("invalid padding string 'full'; give \"same\", \"valid\" or a size"));
}

// PyTorch 1.13, float64: Conv2d(1, 1, (2, 3), padding=(1, 2), padding_mode=mode) with
// weight (arange(6) % 4) * 0.25 - 0.375, bias 0.25, x = arange(12) * 0.1 - 0.5 as
// [1, 1, 3, 4]; y = conv(x), then (y * y).sum().backward().
TEST_CASE("Conv2d padding_mode reflect, replicate and circular match PyTorch", "[nn][layers]") {
  struct Case {
    PadMode mode;
    const char* name;
    std::vector<double> y, gx, gw;
  };
  const Case c = GENERATE(
      Case{PadMode::reflect, "reflect",
           {0.3, 0.35, 0.3, 0.25, 0.2, 0.25, 0.4, 0.45, 0.4, 0.35, 0.3, 0.35,
            0.2, 0.25, 0.2, 0.15, 0.1, 0.15, 0.1, 0.15, 0.1, 0.05, 0.0, 0.05},
           {-0.425, -0.75, -0.65, -0.275, -0.6, -1.0, -0.8, -0.3, -0.175, -0.25, -0.15, -0.025},
           {-1.0, -1.12, -1.0, -0.04, -0.16, -0.04}},
      Case{PadMode::replicate, "replicate",
           {0.5, 0.5, 0.45, 0.4, 0.35, 0.35, 0.45, 0.45, 0.4, 0.35, 0.3, 0.3,
            0.25, 0.25, 0.2, 0.15, 0.1, 0.1, 0.1, 0.1, 0.05, 0.0, -0.05, -0.05},
           {-2.0875, -0.7, -0.6125, -0.8375, -0.4, -0.25, -0.2, -0.5, -0.1125, -0.15, -0.0875,
            -0.0625},
           {-4.04, -3.5, -2.84, -1.4, -0.86, -0.2}},
      Case{PadMode::circular, "circular",
           {0.05, 0.2, 0.15, 0.1, 0.05, 0.2, 0.3, 0.45, 0.4, 0.35, 0.3, 0.45,
            0.1, 0.25, 0.2, 0.15, 0.1, 0.25, 0.05, 0.2, 0.15, 0.1, 0.05, 0.2},
           {-0.8, -0.4125, -0.5125, -0.3375, -0.75, -0.3, -0.05, -0.25, -0.65, -0.1875, -0.1375,
            -0.4125},
           {0.3, -0.5, -0.34, 0.54, -0.26, -0.1}});
  INFO("padding_mode " << c.name);
  Conv2d conv(1, 1, {2, 3}, {.padding = {1, 2}, .padding_mode = c.mode});
  std::vector<double> w(6), xv(12);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<double>(i % 4) * 0.25 - 0.375;
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<double>(i) * 0.1 - 0.5;
  conv.weight.detach().copy_(Tensor::from_vector<double>(w, {1, 1, 2, 3}));
  conv.bias.detach().fill_(0.25);
  Tensor x = Tensor::from_vector<double>(xv, {1, 1, 3, 4}).to(DType::f32).requires_grad_();
  const Tensor y = conv(x);
  REQUIRE(y.shape() == Shape{1, 1, 4, 6});
  check_close(y, c.y, 1e-5);
  lockstep::runtime::sum(lockstep::runtime::mul(y, y)).backward();
  check_close(x.grad(), c.gx, 1e-5);
  check_close(conv.weight.grad(), c.gw, 1e-5);
  CHECK(conv.str() == std::string("Conv2d(1, 1, kernel_size=(2, 3), stride=(1, 1), "
                                  "padding=(1, 2), padding_mode=") + c.name + ")");
  CHECK(conv.state_dict().keys() == std::vector<std::string>{"weight", "bias"});  // PyTorch's
  CHECK(std::dynamic_pointer_cast<Conv2d>(conv.replicate())->options.padding_mode == c.mode);
}

TEST_CASE("Conv2d padding_mode with padding=\"same\" and its refusals", "[nn][layers]") {
  // PyTorch 1.13: Conv2d(1, 1, (2, 4), padding="same", padding_mode="circular", bias=False),
  // weight arange(8) * 0.125, x as above: 1 row below, 1 column left and 2 right wrapped.
  Conv2d conv(1, 1, {2, 4}, {.padding = "same", .bias = false,
                             .padding_mode = PadMode::circular});
  std::vector<double> xv(12);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<double>(i) * 0.1 - 0.5;
  conv.weight.detach().copy_(
      lockstep::runtime::mul(Tensor::arange(8, DType::f32), 0.125)
          .reshape({1, 1, 2, 4}));
  check_close(conv(Tensor::from_vector<double>(xv, {1, 1, 3, 4}).to(DType::f32)),
              {-0.15, 0.0, -0.15, -0.2, 1.25, 1.4, 1.25, 1.2, -0.65, -0.5, -0.65, -0.7}, 1e-5);

  Conv2d reflect(1, 1, 3, {.padding = 3, .padding_mode = PadMode::reflect});
  CHECK_THAT(error_of([&] { reflect(Tensor::zeros({1, 1, 3, 4})); }),
             Contains("reflect padding (3, 3) does not fit dim 2 of input [1, 1, 3, 4]: "
                      "reflect needs each padding < the dim's size"));
  Conv2d circular(1, 1, 3, {.padding = 5, .padding_mode = PadMode::circular});
  CHECK_THAT(error_of([&] { circular(Tensor::zeros({1, 1, 5, 4})); }),
             Contains("circular padding (5, 5) does not fit dim 3 of input [1, 1, 5, 4]"));
}

// PyTorch 1.13: F.conv2d(x, w, padding="same") with x = arange(12) * 0.1 - 0.5 as
// [1, 1, 3, 4] and w = arange(8) * 0.125 as [1, 1, 2, 4] (float64).
TEST_CASE("functional conv2d takes padding \"same\" and \"valid\" as Conv2d", "[nn][layers]") {
  namespace F = lockstep::nn::functional;
  std::vector<double> xv(12);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<double>(i) * 0.1 - 0.5;
  Tensor x = Tensor::from_vector<double>(xv, {1, 1, 3, 4}).requires_grad_();
  const Tensor w =
      lockstep::runtime::mul(Tensor::arange(8, DType::f64), 0.125).reshape({1, 1, 2, 4});
  const Tensor y = F::conv2d(x, w, {}, "same");
  check_close(y, {-0.25, 0.0, 0.125, 0.15, 0.95, 1.4, 1.025, 0.65, 0.325, 0.4, 0.2125, 0.075},
              1e-12);
  CHECK(F::conv2d(x, w, {}, "valid").shape() == Shape{1, 1, 2, 1});
  CHECK(F::conv2d(x, w, {}, Size2(1, 2)).shape() == Shape{1, 1, 4, 5});
  CHECK(F::conv2d(x, w, {}, 1).shape() == Shape{1, 1, 4, 3});
  // The module is the same function of its weight.
  Conv2d conv(1, 1, {2, 4}, {.padding = "same", .bias = false});
  conv.weight.detach().copy_(w);
  check_close(conv(x.to(DType::f32)), values(y), 1e-5);
  CHECK_THAT(error_of([&] { F::conv2d(x, w, {}, "same", 2); }),
             Contains("conv2d: padding=\"same\" needs stride 1, got stride (2, 2)"));
  CHECK_THAT(error_of([&] { F::conv2d(x, w, {}, "full"); }),
             Contains("invalid padding string 'full'"));
}

TEST_CASE("Embedding padding_idx: a zero row that gets no gradient", "[nn][layers]") {
  Generator gen(5);
  Embedding emb(6, 3, {.padding_idx = -1}, gen);  // from the end: row 5
  REQUIRE(emb.padding_idx == 5);
  CHECK(emb.str() == "Embedding(6, 3, padding_idx=5)");
  CHECK(values(emb.weight.select(0, 5)) == std::vector<double>(3, 0.0));
  CHECK(values(emb.weight.select(0, 0)) != std::vector<double>(3, 0.0));
  Tensor idx = Tensor::from_vector<int64_t>({5, 2, 5, 2}, {2, 2});
  lockstep::runtime::sum(emb(idx)).backward();
  std::vector<double> want(18, 0.0);
  for (int j = 6; j < 9; ++j) want[j] = 2;  // row 2, looked up twice
  CHECK(values(emb.weight.grad()) == want);

  auto copy = std::dynamic_pointer_cast<Embedding>(emb.replicate());
  REQUIRE(copy);
  CHECK(copy->padding_idx == 5);
  CHECK(Embedding(6, 3, gen).str() == "Embedding(6, 3)");
  CHECK_THAT(error_of([&] { Embedding(6, 3, {.padding_idx = 6}, gen); }),
             Contains("padding_idx 6 is out of range for num_embeddings 6; give one in [-6, 6)"));
  CHECK_THAT(error_of([&] { Embedding(6, 3, {.padding_idx = -7}, gen); }),
             Contains("padding_idx -7"));
}

TEST_CASE("Dropout: seeded, scaled, identity in eval", "[nn][layers]") {
  Tensor x = Tensor::ones({1000});
  Dropout a(0.25, 9), b(0.25, 9);
  auto ya = values(a(x));
  CHECK(ya == values(b(x)));  // same seed, same mask
  int zeros = 0;
  for (double v : ya) {
    if (v == 0.0)
      ++zeros;
    else
      CHECK(v == Approx(1.0 / 0.75));
  }
  CHECK(zeros > 180);
  CHECK(zeros < 320);
  a.eval();
  CHECK(values(a(x)) == values(x));
  CHECK_THROWS_AS(Dropout(1.5), lockstep::Error);
}

TEST_CASE("pooling, flatten and activations", "[nn][layers]") {
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
                                        {1, 1, 4, 4});
  MaxPool2d mp(2);
  CHECK(mp.stride == Size2(2));
  CHECK(values(mp(x)) == std::vector<double>{6, 8, 14, 16});
  CHECK(mp.str() == "MaxPool2d(kernel_size=2, stride=2, padding=0)");
  AvgPool2d ap(2, 1);
  CHECK(ap(x).shape() == Shape{1, 1, 3, 3});
  CHECK(values(ap(x))[0] == Approx(3.5));
  AdaptiveAvgPool2d gap(1);
  CHECK(values(gap(x)) == std::vector<double>{8.5});
  // ceil_mode keeps the last, clipped window of a 4x4 input by kernel 3, stride 2.
  MaxPool2d mp_ceil(3, 2, 0, true);
  CHECK(values(mp_ceil(x)) == std::vector<double>{11, 12, 15, 16});
  CHECK(mp_ceil.str() == "MaxPool2d(kernel_size=3, stride=2, padding=0, ceil_mode=true)");
  CHECK(std::dynamic_pointer_cast<MaxPool2d>(mp_ceil.replicate())->ceil_mode);
  AvgPool2d ap_ceil(3, 2, 0, true);
  CHECK(values(ap_ceil(x)) == std::vector<double>{6, 7.5, 12, 13.5});
  CHECK(std::dynamic_pointer_cast<AvgPool2d>(ap_ceil.replicate())->ceil_mode);

  Flatten flat;
  CHECK(flat(Tensor::zeros({2, 3, 4, 5})).shape() == Shape{2, 60});
  CHECK(Flatten(0)(Tensor::zeros({2, 3})).shape() == Shape{6});

  Tensor v = Tensor::from_vector<float>({-1, 0, 2}, {3});
  CHECK(values(ReLU()(v)) == std::vector<double>{0, 0, 2});
  CHECK(values(GELU()(v))[2] == Approx(2 * 0.5 * (1 + std::erf(2 / std::sqrt(2.0)))));
}

TEST_CASE("losses as modules match the functions", "[nn][layers]") {
  Tensor logits = Tensor::from_vector<float>({1, 2, 3, 1, 1, 1}, {2, 3});
  Tensor target = Tensor::from_vector<int64_t>({2, 0}, {2});
  CrossEntropyLoss ce;
  // Row 0: logsumexp(1,2,3) - 3; row 1: log(3).
  const double row0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0;
  CHECK(ce(logits, target).item() == Approx((row0 + std::log(3.0)) / 2));
  CrossEntropyLoss smooth({.label_smoothing = 0.1, .reduction = Reduction::Sum});
  CHECK(smooth(logits, target).item() ==
        Approx(functional::cross_entropy(logits, target, 0.1, Reduction::Sum).item()));
  CHECK_THAT(error_of([&] { ce.forward(logits); }), Contains("takes (input, target)"));
  // ignore_index, as PyTorch's -100 padding: only row 0 counts.
  CrossEntropyLoss padded({.label_smoothing = 0.1, .ignore_index = -100});
  CHECK(padded(logits, Tensor::from_vector<int64_t>({2, -100}, {2})).item() ==
        Approx(functional::cross_entropy(logits.slice(0, 0, 1), target.slice(0, 0, 1), 0.1)
                   .item()));
  CHECK(padded.extra_repr() == "ignore_index=-100, label_smoothing=0.1");

  MSELoss mse;
  Tensor a = Tensor::from_vector<float>({1, 2, 3}, {3});
  Tensor b = Tensor::from_vector<float>({1, 0, 0}, {3});
  CHECK(mse(a, b).item() == Approx((4.0 + 9.0) / 3));
}

TEST_CASE("Sequential: indices as names, typed access, forward in order", "[nn][layers]") {
  Sequential seq;
  auto fc = seq.push_back(std::make_shared<Linear>(4, 4));
  seq.push_back(std::make_shared<ReLU>());
  CHECK(seq.size() == 2);
  CHECK(seq.at<Linear>(0).get() == fc.get());
  CHECK_THAT(error_of([&] { seq.at<Linear>(1); }), Contains("the module there is a ReLU"));
  CHECK_THROWS_AS(seq[2], lockstep::Error);
  Tensor x = Tensor::ones({1, 4});
  CHECK(bitwise_equal(seq(x), lockstep::runtime::relu(fc->forward(x))));
}
