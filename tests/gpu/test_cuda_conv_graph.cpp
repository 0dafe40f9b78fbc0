// conv2d on CUDA through cuDNN's graph API (cudnn_graph_conv.h) against the
// CPU op, forward and backward (input, weight and bias gradients): groups,
// strides, padding and dilation together, f32 and f64, and an input only
// 4-byte aligned (a key, and a plan, of its own). The path counters must show
// the graph API ran, unless LOCKSTEP_CUDNN_LEGACY=1 sends every convolution to
// the legacy API. Tolerances as in test_cuda_conv.cpp: relative + absolute,
// the absolute part scaled by the largest |value| of the reference; f32
// 1e-4 + 1e-5 max (TF32, off by default, would miss them), f64 1e-10 + 1e-11.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu/cuda_op_check.h"
#include "lockstep/config.h"
#include "lockstep/runtime/ops/conv.h"
#include "lockstep/runtime/tensor.h"
#include "support/gpu_skip.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/runtime/cuda/ops/cudnn_graph_conv.h"
#include "lockstep/runtime/cuda/ops/math_mode.h"
#endif

using namespace lockstep::runtime;
using namespace lockstep::testing;

#if LOCKSTEP_HAVE_CUDA
namespace {

struct ConvCase {
  Shape x, w;
  Conv2dOptions o;
  std::string what;
};

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.detach().to_vector<double>()) m = std::max(m, std::abs(v));
  return m;
}

void check_scaled(const Tensor& got, const Tensor& want, const std::string& what) {
  const bool f64 = want.dtype() == DType::f64;
  const double rtol = f64 ? 1e-10 : 1e-4, atol_scale = f64 ? 1e-11 : 1e-5;
  check_close_to(got, want, rtol, atol_scale * std::max(1.0, max_abs(want)), what);
}

// conv2d on CPU copies and on the device (x_dev: x's values on the device),
// backward from one random gradient; compares the output and the gradients.
// Three cuDNN convolutions: forward, backward-data, backward-filter.
void check_conv(const ConvCase& c, const Tensor& x, const Tensor& x_dev, const Tensor& w,
                const Tensor& b, uint64_t seed) {
  Tensor xc = x.clone().requires_grad_(), wc = w.clone().requires_grad_();
  Tensor bc = b.defined() ? b.clone().requires_grad_() : Tensor();
  Tensor xg = x_dev.detach().requires_grad_(), wg = w.to(cuda0()).requires_grad_();
  Tensor bg = b.defined() ? b.to(cuda0()).requires_grad_() : Tensor();
  Tensor yc = conv2d(xc, wc, bc, c.o), yg = conv2d(xg, wg, bg, c.o);
  check_scaled(yg, yc, c.what + ": forward");
  const Tensor gy = randn_cpu(yc.shape(), seed, x.dtype());
  yc.backward(gy);
  yg.backward(gy.to(cuda0()));
  REQUIRE(xg.grad().defined());
  REQUIRE(wg.grad().defined());
  check_scaled(xg.grad(), xc.grad(), c.what + ": grad x");
  check_scaled(wg.grad(), wc.grad(), c.what + ": grad w");
  if (b.defined()) {
    REQUIRE(bg.grad().defined());
    check_scaled(bg.grad(), bc.grad(), c.what + ": grad b");
  }
}

// Every convolution since `before` was counted once, and, unless the legacy
// API is forced, some went through the graph API.
void check_paths(const cuda::CudnnPathStats& before, int64_t convolutions) {
  const cuda::CudnnPathStats after = cuda::conv_path_stats();
  INFO("graph " << after.graph - before.graph << ", legacy " << after.legacy - before.legacy);
  CHECK(after.graph - before.graph + after.legacy - before.legacy == convolutions);
  if (cuda::cudnn_legacy_forced()) {
    CHECK(after.graph == before.graph);
  } else {
    CHECK(after.graph > before.graph);
  }
}

}  // namespace
#endif

TEST_CASE("CUDA conv2d through cuDNN's graph API matches the CPU", "[gpu][cuda_conv]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
#if LOCKSTEP_HAVE_CUDA
  poison_device_memory();
  CHECK_FALSE(cuda::allow_tf32());
  const DType dt = GENERATE(DType::f32, DType::f64);
  const std::vector<ConvCase> cases = {
      {{2, 4, 11, 10}, {6, 2, 3, 3}, {{2, 2}, {1, 2}, {2, 2}, 2},
       "2 groups, stride 2, padding, dilation 2"},
      {{3, 8, 13, 12}, {8, 4, 3, 2}, {{2, 1}, {2, 1}, {2, 3}, 2},
       "2 groups, uneven stride, padding and dilation"},
      {{4, 16, 16, 16}, {32, 8, 3, 3}, {{2, 2}, {2, 2}, {2, 2}, 2}, "2 groups, 16 channels"},
  };
  const cuda::CudnnPathStats before = cuda::conv_path_stats();
  int64_t convolutions = 0;
  uint64_t seed = 1;
  for (const ConvCase& c : cases) {
    const Tensor x = randn_cpu(c.x, seed++, dt), w = randn_cpu(c.w, seed++, dt);
    const Tensor b = randn_cpu({c.w[0]}, seed++, dt);
    check_conv(c, x, x.to(cuda0()), w, b, seed++);
    check_conv({c.x, c.w, c.o, c.what + ", no bias"}, x, x.to(cuda0()), w, Tensor(), seed++);
    convolutions += 6;
  }
  check_paths(before, convolutions);
#endif
}

TEST_CASE("CUDA conv2d through cuDNN's graph API follows the data's alignment",
          "[gpu][cuda_conv]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
#if LOCKSTEP_HAVE_CUDA
  poison_device_memory();
  const ConvCase c{{2, 3, 7, 9}, {4, 3, 3, 3}, {{2, 2}, {1, 1}, {2, 2}, 1}, "aligned x"};
  const Tensor x = randn_cpu(c.x, 101), w = randn_cpu(c.w, 102), b = randn_cpu({4}, 103);
  const cuda::CudnnPathStats before = cuda::conv_path_stats();
  check_conv(c, x, x.to(cuda0()), w, b, 104);

  // Images 1 and 2 of a batch of 3 on the device: 3 * 7 * 9 floats in, the
  // data pointer is 4-byte aligned only, which the plan must be built for.
  const Tensor big = randn_cpu({3, 3, 7, 9}, 105);
  const Tensor x_offset = big.to(cuda0()).slice(0, 1, 3);
  REQUIRE(x_offset.is_contiguous());
  REQUIRE(reinterpret_cast<std::uintptr_t>(x_offset.raw_data()) % 8 == 4);
  check_conv({c.x, c.w, c.o, "4-byte aligned x"}, big.slice(0, 1, 3).clone(), x_offset, w, b, 106);
  check_paths(before, 6);
#endif
}

TEST_CASE("CUDA conv2d in cuDNN benchmark mode times its engines and still matches the CPU",
          "[gpu][cuda_conv]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
#if LOCKSTEP_HAVE_CUDA
  poison_device_memory();
  // Timing runs every engine on the real operands: outputs must still be the
  // chosen engine's, at the first call (which times) and at the next (cached).
  struct Restore {
    bool was = cuda::cudnn_benchmark();
    ~Restore() { cuda::set_cudnn_benchmark(was); }
  } restore;
  cuda::set_cudnn_benchmark(true);
  const DType dt = GENERATE(DType::f32, DType::f64);
  const ConvCase c{{8, 16, 20, 20}, {32, 16, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 1},
                   "benchmark mode, ResNet-like 3x3"};
  const Tensor x = randn_cpu(c.x, 201, dt), w = randn_cpu(c.w, 202, dt);
  const Tensor b = randn_cpu({c.w[0]}, 203, dt);
  const cuda::CudnnPathStats before = cuda::conv_path_stats();
  check_conv(c, x, x.to(cuda0()), w, b, 204);
  check_conv({c.x, c.w, c.o, c.what + ", again"}, x, x.to(cuda0()), w, b, 205);
  check_paths(before, 6);
#endif
}
