// conv2d: forward and backward against a direct-convolution loop, gradient
// checks over every option, error messages.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "lockstep/runtime/ops/conv.h"
#include "lockstep/runtime/random.h"
#include "support/gradcheck.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

namespace {

struct Config {
  const char* name;
  int64_t n, c_in, h, w, c_out, kh, kw;
  int64_t sh, sw, ph, pw, dh, dw, groups;
  bool bias;
  Conv2dOptions options() const { return {{sh, sw}, {ph, pw}, {dh, dw}, groups}; }
  int64_t oh() const { return (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1; }
  int64_t ow() const { return (w + 2 * pw - dw * (kw - 1) - 1) / sw + 1; }
};

// Covers the kernel's paths: the shifted-copy im2col ("same" padding, unit
// stride), the generic one (strides, dilation, uneven padding), the 1x1
// pointwise shortcut, one image per gemm (>= 256 output pixels) and several.
const std::vector<Config> kConfigs = {
    {"3x3 pad 1 (large maps)", 2, 3, 17, 16, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},
    {"3x3 pad 1 (small maps)", 3, 2, 6, 5, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},
    {"3x3 pad 1, 3 + 2 images per gemm", 5, 2, 10, 10, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},
    {"3x3 stride 2 pad 1", 2, 3, 9, 8, 4, 3, 3, 2, 2, 1, 1, 1, 1, 1, true},
    {"3x3 dilation 2 pad 2", 2, 2, 9, 9, 3, 3, 3, 1, 1, 2, 2, 2, 2, 1, false},
    {"3x3 groups 2", 2, 4, 7, 6, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2, true},
    {"1x1 pointwise", 2, 4, 5, 6, 3, 1, 1, 1, 1, 0, 0, 1, 1, 1, true},
    {"1x1 pointwise large maps, groups 2", 2, 4, 16, 17, 4, 1, 1, 1, 1, 0, 0, 1, 1, 2, true},
    {"1x1 stride 2", 2, 3, 7, 7, 2, 1, 1, 2, 2, 0, 0, 1, 1, 1, false},
    {"5x5 pad 2", 2, 2, 8, 7, 3, 5, 5, 1, 1, 2, 2, 1, 1, 1, true},
    {"5x3 mixed stride/pad/dilation", 2, 2, 11, 9, 2, 5, 3, 2, 1, 1, 2, 1, 2, 1, true},
    {"3x3 no padding, C_in 1", 3, 1, 8, 9, 4, 3, 3, 1, 1, 0, 0, 1, 1, 1, true},
    {"depthwise 3x3 stride 2 dilation 2", 2, 3, 10, 10, 3, 3, 3, 2, 2, 2, 2, 2, 2, 3, true},
};

using Vec = std::vector<double>;

// y = conv(x, w) + b by the definition, one output element at a time.
Vec naive_forward(const Config& c, const Vec& x, const Vec& w, const Vec& b) {
  const int64_t oh = c.oh(), ow = c.ow(), cin_g = c.c_in / c.groups, cout_g = c.c_out / c.groups;
  Vec y(c.n * c.c_out * oh * ow);
  for (int64_t n = 0; n < c.n; ++n)
    for (int64_t co = 0; co < c.c_out; ++co)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double acc = c.bias ? b[co] : 0.0;
          const int64_t g = co / cout_g;
          for (int64_t ci = 0; ci < cin_g; ++ci)
            for (int64_t ki = 0; ki < c.kh; ++ki)
              for (int64_t kj = 0; kj < c.kw; ++kj) {
                const int64_t ih = i * c.sh - c.ph + ki * c.dh, iw = j * c.sw - c.pw + kj * c.dw;
                if (ih < 0 || ih >= c.h || iw < 0 || iw >= c.w) continue;
                acc += x[((n * c.c_in + g * cin_g + ci) * c.h + ih) * c.w + iw] *
                       w[((co * cin_g + ci) * c.kh + ki) * c.kw + kj];
              }
          y[((n * c.c_out + co) * oh + i) * ow + j] = acc;
        }
  return y;
}

// The gradients of sum(gy * conv(x, w)) by the same loops, transposed.
void naive_backward(const Config& c, const Vec& x, const Vec& w, const Vec& gy, Vec& gx, Vec& gw,
                    Vec& gb) {
  const int64_t oh = c.oh(), ow = c.ow(), cin_g = c.c_in / c.groups, cout_g = c.c_out / c.groups;
  gx.assign(x.size(), 0.0);
  gw.assign(w.size(), 0.0);
  gb.assign(c.c_out, 0.0);
  for (int64_t n = 0; n < c.n; ++n)
    for (int64_t co = 0; co < c.c_out; ++co)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          const double g = gy[((n * c.c_out + co) * oh + i) * ow + j];
          gb[co] += g;
          const int64_t grp = co / cout_g;
          for (int64_t ci = 0; ci < cin_g; ++ci)
            for (int64_t ki = 0; ki < c.kh; ++ki)
              for (int64_t kj = 0; kj < c.kw; ++kj) {
                const int64_t ih = i * c.sh - c.ph + ki * c.dh, iw = j * c.sw - c.pw + kj * c.dw;
                if (ih < 0 || ih >= c.h || iw < 0 || iw >= c.w) continue;
                const int64_t xi = ((n * c.c_in + grp * cin_g + ci) * c.h + ih) * c.w + iw;
                const int64_t wi = ((co * cin_g + ci) * c.kh + ki) * c.kw + kj;
                gx[xi] += g * w[wi];
                gw[wi] += g * x[xi];
              }
        }
}

double max_rel_err(const Vec& got, const Vec& want) {
  double err = got.size() == want.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    err = std::max(err, std::abs(got[i] - want[i]) / (1.0 + std::abs(want[i])));
  return err;
}

}  // namespace

TEST_CASE("conv2d forward and backward match a direct convolution", "[runtime][ops][conv]") {
  const Config c = GENERATE(from_range(kConfigs));
  const DType dtype = GENERATE(DType::f32, DType::f64);
  INFO(c.name << " " << dtype_name(dtype));
  Generator g(7);
  Tensor x = randn({c.n, c.c_in, c.h, c.w}, dtype, g).requires_grad_();
  Tensor w = randn({c.c_out, c.c_in / c.groups, c.kh, c.kw}, dtype, g).requires_grad_();
  Tensor b = c.bias ? randn({c.c_out}, dtype, g).requires_grad_() : Tensor();
  Tensor y = conv2d(x, w, b, c.options());
  REQUIRE(y.shape() == Shape{c.n, c.c_out, c.oh(), c.ow()});
  REQUIRE(y.is_contiguous());

  const Vec xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const Vec bv = c.bias ? b.to_vector<double>() : Vec();
  const double tol = dtype == DType::f32 ? 2e-5 : 1e-12;
  CHECK(max_rel_err(y.to_vector<double>(), naive_forward(c, xv, wv, bv)) < tol);

  Tensor gy = randn(y.shape(), dtype, g);
  y.backward(gy);
  Vec gx, gw, gb;
  naive_backward(c, xv, wv, gy.to_vector<double>(), gx, gw, gb);
  CHECK(max_rel_err(x.grad().to_vector<double>(), gx) < tol * 10);
  CHECK(max_rel_err(w.grad().to_vector<double>(), gw) < tol * 10);
  if (c.bias) CHECK(max_rel_err(b.grad().to_vector<double>(), gb) < tol * 10);
}

TEST_CASE("conv2d gradcheck over every option", "[runtime][ops][conv][gradcheck]") {
  const Config c = GENERATE(from_range(kConfigs));
  INFO(c.name);
  std::vector<Tensor> in{random_input({c.n, c.c_in, c.h, c.w}, 1),
                         random_input({c.c_out, c.c_in / c.groups, c.kh, c.kw}, 2)};
  if (c.bias) in.push_back(random_input({c.c_out}, 3));
  auto r = gradcheck(
      [&](const std::vector<Tensor>& t) {
        return conv2d(t[0], t[1], t.size() > 2 ? t[2] : Tensor(), c.options());
      },
      in);
  INFO(r.message);
  CHECK(r.ok);
}

TEST_CASE("conv2d computes only the gradients that are needed", "[runtime][ops][conv]") {
  Generator g(3);
  Tensor x = randn({2, 1, 6, 6}, DType::f64, g);  // like a first layer: no grad for the image
  Tensor w = randn({4, 1, 3, 3}, DType::f64, g).requires_grad_();
  Tensor b = randn({4}, DType::f64, g);
  Tensor y = conv2d(x, w, b, {.padding = {1, 1}});
  y.backward(Tensor::ones(y.shape(), DType::f64));
  CHECK(w.grad().defined());
  CHECK_FALSE(x.grad().defined());
  CHECK_FALSE(b.grad().defined());
}

TEST_CASE("conv2d reads non-contiguous inputs", "[runtime][ops][conv]") {
  Generator g(5);
  Tensor base = randn({2, 5, 6, 3}, DType::f64, g);
  Tensor x = base.permute({0, 3, 1, 2});  // [2, 3, 5, 6], not contiguous
  REQUIRE_FALSE(x.is_contiguous());
  Tensor w = randn({4, 3, 3, 3}, DType::f64, g).transpose(2, 3);
  const Conv2dOptions o{.stride = {1, 2}, .padding = {1, 0}};
  Tensor y = conv2d(x, w, {}, o);
  Tensor y_ref = conv2d(x.contiguous(), w.contiguous(), {}, o);
  CHECK(y.to_vector<double>() == y_ref.to_vector<double>());
}

TEST_CASE("conv2d rejects bad shapes with clear messages", "[runtime][ops][conv]") {
  Tensor x = Tensor::zeros({2, 3, 8, 8});
  Tensor w = Tensor::zeros({4, 3, 3, 3});
  CHECK_THAT(error_of([&] { conv2d(Tensor::zeros({2, 4, 8, 8}), w); }),
             Contains("expected input [N, C, H, W] with C = 3 (weight's in_channels * groups), "
                      "got [2, 4, 8, 8]"));
  CHECK_THAT(error_of([&] { conv2d(Tensor::zeros({3, 8, 8}), w); }),
             Contains("expected input [N, C, H, W]"));
  CHECK_THAT(error_of([&] { conv2d(x, Tensor::zeros({4, 3, 3})); }),
             Contains("expected weight [C_out, C_in / groups, kH, kW], got [4, 3, 3]"));
  CHECK_THAT(error_of([&] { conv2d(x, w, Tensor::zeros({5})); }),
             Contains("expected bias [4]"));
  CHECK_THAT(error_of([&] { conv2d(Tensor::zeros({2, 6, 8, 8}), Tensor::zeros({5, 3, 3, 3}), {},
                                   {.groups = 2}); }),
             Contains("out_channels 5 is not divisible by groups 2"));
  CHECK_THAT(error_of([&] { conv2d(x, Tensor::zeros({4, 3, 9, 9})); }),
             Contains("larger than the padded input"));
  CHECK_THAT(error_of([&] { conv2d(x, w, {}, {.stride = {0, 1}}); }),
             Contains("stride and dilation must be >= 1"));
  CHECK_THAT(error_of([&] { conv2d(x, w.to(DType::f64)); }), Contains("input is f32 but weight is f64"));
  CHECK_THAT(error_of([&] { conv2d(x.to(DType::i32), w.to(DType::i32)); }), Contains("f32 or f64"));
}
