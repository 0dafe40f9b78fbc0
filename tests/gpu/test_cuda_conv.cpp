// conv2d on CUDA (cuDNN) against the CPU op, forward and backward (input,
// weight and bias gradients): strides, padding, dilation, groups (depthwise
// included), 1x1 kernels, odd sizes, an empty batch, non-contiguous inputs,
// bf16 and f16, the cached algorithm choice, and TF32 off by default.
// Tolerances, relative + absolute with the absolute part scaled by the
// largest |value| of the reference (cuDNN may use Winograd or FFT
// algorithms, whose rounding follows the magnitude of the whole result): f32
// 1e-4 + 1e-5 max; f64 1e-10 + 1e-11 max; bf16 1/64 + 1/128 max and f16
// 1/512 + 1/1024 max (one rounding to 16 bits of an f32 result) against the
// CPU op in f32 on the same rounded inputs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gpu/cuda_op_check.h"
#include "lockstep/config.h"
#include "lockstep/runtime/ops/conv.h"
#include "lockstep/runtime/tensor.h"
#include "support/gpu_skip.h"
#include "support/test_util.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/runtime/cuda/ops/math_mode.h"
#endif

using namespace lockstep::runtime;
using namespace lockstep::testing;

namespace {

struct ConvCase {
  Shape x, w;
  Conv2dOptions o;
};

const std::vector<ConvCase> kCases = {
    {{2, 3, 8, 8}, {4, 3, 3, 3}, {}},
    {{1, 2, 7, 9}, {3, 2, 3, 3}, {{2, 2}, {1, 1}, {1, 1}, 1}},    // strided, padded
    {{2, 4, 9, 7}, {6, 2, 3, 2}, {{1, 2}, {1, 0}, {1, 1}, 2}},    // 2 groups, uneven
    {{1, 3, 10, 11}, {2, 3, 3, 3}, {{1, 1}, {2, 2}, {2, 2}, 1}},  // dilated
    {{3, 6, 5, 5}, {6, 1, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 6}},    // depthwise
    {{2, 8, 4, 4}, {16, 8, 1, 1}, {}},                            // pointwise
    {{2, 5, 6, 6}, {7, 5, 1, 1}, {{2, 2}, {0, 0}, {1, 1}, 1}},    // strided 1x1
    {{1, 1, 1, 1}, {1, 1, 1, 1}, {}},
    {{4, 16, 13, 13}, {32, 16, 5, 5}, {{2, 2}, {2, 2}, {1, 1}, 1}},
};

std::string describe(const ConvCase& c) {
  return "x " + shape_str(c.x) + " w " + shape_str(c.w) + " stride [" +
         std::to_string(c.o.stride[0]) + ", " + std::to_string(c.o.stride[1]) + "] padding [" +
         std::to_string(c.o.padding[0]) + ", " + std::to_string(c.o.padding[1]) +
         "] dilation [" + std::to_string(c.o.dilation[0]) + ", " +
         std::to_string(c.o.dilation[1]) + "] groups " + std::to_string(c.o.groups);
}

struct Tol {
  double rtol, atol_scale;
};

Tol tolerance(DType dt) {
  switch (dt) {
    case DType::f64: return {1e-10, 1e-11};
    case DType::bf16: return {1.0 / 64, 1.0 / 128};
    case DType::f16: return {1.0 / 512, 1.0 / 1024};
    default: return {1e-4, 1e-5};
  }
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.detach().to_vector<double>()) m = std::max(m, std::abs(v));
  return m;
}

void check_scaled(const Tensor& got, const Tensor& want, Tol tol, const std::string& what) {
  check_close_to(got, want, tol.rtol, tol.atol_scale * std::max(1.0, max_abs(want)), what);
}

bool narrow(DType dt) { return dt == DType::bf16 || dt == DType::f16; }

// conv2d on CPU copies and on the device (x_dev: the same values as x in any
// layout), backward from one random gradient; compares output and gradients.
void check_conv(const ConvCase& c, const Tensor& x, const Tensor& x_dev, const Tensor& w,
                const Tensor& b, const std::string& what, uint64_t seed) {
  const DType dt = x.dtype();
  const Tol tol = tolerance(dt);
  auto leaf = [](const Tensor& t) {
    return (narrow(t.dtype()) ? t.to(DType::f32) : t.clone()).requires_grad_();
  };
  Tensor xc = leaf(x), wc = leaf(w), bc = b.defined() ? leaf(b) : Tensor();
  Tensor xg = x_dev.detach().requires_grad_();
  Tensor wg = w.to(cuda0()).requires_grad_();
  Tensor bg = b.defined() ? b.to(cuda0()).requires_grad_() : Tensor();
  Tensor yc = conv2d(xc, wc, bc, c.o), yg = conv2d(xg, wg, bg, c.o);
  CHECK(yg.device() == cuda0());
  CHECK(yg.dtype() == dt);
  check_scaled(yg, yc, tol, what + " forward");
  const Tensor gy = randn_cpu(yc.shape(), seed, dt);
  yc.backward(narrow(dt) ? gy.to(DType::f32) : gy);
  yg.backward(gy.to(cuda0()));
  REQUIRE(xg.grad().defined());
  REQUIRE(wg.grad().defined());
  check_scaled(xg.grad(), xc.grad(), tol, what + " grad x");
  check_scaled(wg.grad(), wc.grad(), tol, what + " grad w");
  if (b.defined()) {
    REQUIRE(bg.grad().defined());
    check_scaled(bg.grad(), bc.grad(), tol, what + " grad b");
  }
}

}  // namespace

TEST_CASE("CUDA conv2d matches the CPU, forward and backward", "[gpu][cuda][conv]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::f32, DType::f64);
  uint64_t seed = 1;
  for (const ConvCase& c : kCases) {
    const Tensor x = randn_cpu(c.x, seed++, dt), w = randn_cpu(c.w, seed++, dt);
    const Tensor b = randn_cpu({c.w[0]}, seed++, dt);
    check_conv(c, x, x.to(cuda0()), w, b, describe(c) + " with bias", seed++);
    check_conv(c, x, x.to(cuda0()), w, Tensor(), describe(c) + " without bias", seed++);
  }
}

TEST_CASE("CUDA conv2d of non-contiguous inputs, an empty batch and no input values",
          "[gpu][cuda][conv]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  uint64_t seed = 101;
  const ConvCase& c = kCases[2];
  const Tensor x = randn_cpu(c.x, seed++), w = randn_cpu(c.w, seed++);
  const Tensor b = randn_cpu({c.w[0]}, seed++);
  check_conv(c, x, transposed_on_device(x, 2, 3), w, b, "transposed H and W", seed++);
  check_conv(c, x, strided_on_device(x, 1), w, b, "every other channel", seed++);

  // No images: an empty output; zero weight and bias gradients.
  const ConvCase e{{0, 3, 8, 8}, {4, 3, 3, 3}, {}};
  Tensor xe = Tensor::zeros(e.x, DType::f32, cuda0()).requires_grad_();
  Tensor we = randn_cpu(e.w, seed++).to(cuda0()).requires_grad_();
  Tensor be = randn_cpu({4}, seed++).to(cuda0()).requires_grad_();
  Tensor ye = conv2d(xe, we, be);
  CHECK(ye.shape() == Shape{0, 4, 6, 6});
  ye.backward(Tensor::zeros(ye.shape(), DType::f32, cuda0()));
  check_equal_to(we.grad(), Tensor::zeros(e.w), "empty batch grad w");
  check_equal_to(be.grad(), Tensor::zeros({4}), "empty batch grad b");

  // No input value reaches the output (no input channels; an empty image that
  // padding alone covers): the output is the bias, as on the CPU.
  const ConvCase no_channels{{2, 0, 5, 5}, {4, 0, 3, 3}, {}};
  const ConvCase empty_image{{1, 3, 0, 5}, {4, 3, 1, 1}, {{1, 1}, {1, 1}, {1, 1}, 1}};
  for (const ConvCase& d : {no_channels, empty_image}) {
    const Tensor xd = randn_cpu(d.x, seed++), wd = randn_cpu(d.w, seed++);
    const Tensor bd = randn_cpu({4}, seed++);
    check_conv(d, xd, xd.to(cuda0()), wd, bd, describe(d), seed++);
  }
}

TEST_CASE("CUDA conv2d of bf16 and f16 computes in f32", "[gpu][cuda][conv]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::bf16, DType::f16);
  uint64_t seed = 201;
  for (const ConvCase& c : {kCases[0], kCases[2], kCases[4], kCases[8]}) {
    const Tensor x = randn_cpu(c.x, seed++, dt), w = randn_cpu(c.w, seed++, dt);
    const Tensor b = randn_cpu({c.w[0]}, seed++, dt);
    check_conv(c, x, x.to(cuda0()), w, b, describe(c), seed++);
  }
}

TEST_CASE("CUDA conv2d reuses its cached algorithms and is f32-accurate without TF32",
          "[gpu][cuda][conv]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
#if LOCKSTEP_HAVE_CUDA
  poison_device_memory();
  CHECK_FALSE(cuda::allow_tf32());
  // 576-term sums: TF32 would be off by ~1e-2 relative to the result's scale.
  const ConvCase c{{4, 64, 16, 16}, {32, 64, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 1}};
  const Tensor x = randn_cpu(c.x, 301), w = randn_cpu(c.w, 302);
  const Tensor want = conv2d(x.to(DType::f64), w.to(DType::f64), Tensor(), c.o);
  const Tensor xd = x.to(cuda0()), wd = w.to(cuda0());
  const Tensor first = conv2d(xd, wd, Tensor(), c.o);
  check_scaled(first, want, {1e-4, 1e-5}, "TF32 off");
  // Same shape again: the cached choice, the same (deterministic) forward.
  check_equal_to(conv2d(xd, wd, Tensor(), c.o), first, "second call");
  cuda::set_allow_tf32(true);
  const Tensor fast = conv2d(xd, wd, Tensor(), c.o);
  cuda::set_allow_tf32(false);
  check_scaled(fast, want, {1e-2, 1e-2}, "TF32 on");
  check_equal_to(conv2d(xd, wd, Tensor(), c.o), first, "TF32 off again");
#endif
}

TEST_CASE("CUDA conv2d refuses operands on different devices", "[gpu][cuda][conv]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  const Tensor x = randn_cpu({1, 2, 5, 5}, 401), w = randn_cpu({3, 2, 3, 3}, 402);
  CHECK_THAT(error_of([&] { conv2d(x.to(cuda0()), w); }), Catch::Contains("move them to one"));
  CHECK_THAT(error_of([&] { conv2d(x.to(cuda0()), w.to(cuda0()), Tensor::zeros({3})); }),
             Catch::Contains("bias on cpu"));
}
