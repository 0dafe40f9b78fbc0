// batch_norm (cuDNN in training, own kernels in eval) and layer_norm (own
// kernels) on CUDA against the CPU ops, forward and backward (input, weight
// and bias gradients); training f32 must go through cuDNN's graph API.
// batch_norm: training and eval, 2-D to 5-D inputs, with and without affine
// parameters and running statistics, the running statistics after one and
// two steps (momentum, unbiased variance), f32 and f64.
// layer_norm: one or two normalised dims, rows shorter and longer than a
// block, lengths that allow 16-byte vector loads and odd ones, with and
// without weight and bias, a large mean (the statistics must not cancel),
// non-contiguous input, and many rows (the weight gradient in row chunks);
// f32, f64, bf16 and f16.
// Tolerances (relative + absolute): f32 1e-4 + 1e-4 (statistics in f32
// against the CPU's f64; 1e-3 with a mean of 1000, where f32 inputs carry
// only ~1e-4 of the deviation), f64 1e-10 + 1e-10; bf16 1/64 + 1/32 and f16
// 1/512 + 1/256 (outputs rounded once to 16 bits; the weight and bias
// gradients sum many rows, hence the absolute part) against the CPU op in
// f32 on the same rounded inputs.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "gpu/cuda_op_check.h"
#include "lockstep/config.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/norm.h"
#include "lockstep/runtime/tensor.h"
#include "support/gpu_skip.h"
#include "support/test_util.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/runtime/cuda/ops/cudnn_graph_batch_norm.h"
#endif

using namespace lockstep::runtime;
using namespace lockstep::testing;

namespace {

struct Tol {
  double rtol, atol;
};

Tol tolerance(DType dt) {
  switch (dt) {
    case DType::f64: return {1e-10, 1e-10};
    case DType::bf16: return {1.0 / 64, 1.0 / 32};
    case DType::f16: return {1.0 / 512, 1.0 / 256};
    default: return {1e-4, 1e-4};
  }
}

bool narrow(DType dt) { return dt == DType::bf16 || dt == DType::f16; }

// A CPU leaf (f32 for 16-bit dtypes) or undefined.
Tensor cpu_leaf(const Tensor& t) {
  if (!t.defined()) return {};
  return (narrow(t.dtype()) ? t.to(DType::f32) : t.clone()).requires_grad_();
}
Tensor dev_leaf(const Tensor& t) {
  return t.defined() ? t.to(cuda0()).requires_grad_() : Tensor();
}

// Positive values around 1 (variances).
Tensor positive_cpu(const Shape& shape, uint64_t seed, DType dt) {
  return exp(randn_cpu(shape, seed, DType::f64).mul_(0.5)).to(dt);
}

struct BnCase {
  Shape x;
  bool affine, running;
};

// One batch_norm call on both devices (x_dev: x's values in any layout),
// backward from one random gradient; compares the output, the gradients and
// the running statistics. Two steps in training, so the second update starts
// from the first one's result.
void check_batch_norm(const BnCase& c, const Tensor& x, const Tensor& x_dev, bool training,
                      double momentum, const std::string& what, uint64_t seed) {
  const DType dt = x.dtype();
  const Tol tol = tolerance(dt);
  const int64_t ch = c.x[1];
  const Tensor w = c.affine ? randn_cpu({ch}, seed++, dt) : Tensor();
  const Tensor b = c.affine ? randn_cpu({ch}, seed++, dt) : Tensor();
  Tensor rm_c, rv_c, rm_g, rv_g;
  if (c.running) {
    const Tensor rm = randn_cpu({ch}, seed++, dt), rv = positive_cpu({ch}, seed++, dt);
    rm_c = rm.clone(), rv_c = rv.clone();
    rm_g = rm.to(cuda0()), rv_g = rv.to(cuda0());
  }
  Tensor xc = cpu_leaf(x), wc = cpu_leaf(w), bc = cpu_leaf(b);
  Tensor xg = x_dev.detach().requires_grad_(), wg = dev_leaf(w), bg = dev_leaf(b);
  for (int step = 0; step < (training ? 2 : 1); ++step) {
    const std::string at = what + (step ? " step 2" : "");
    Tensor yc = batch_norm(xc, wc, bc, rm_c, rv_c, training, momentum);
    Tensor yg = batch_norm(xg, wg, bg, rm_g, rv_g, training, momentum);
    CHECK(yg.device() == cuda0());
    check_close_to(yg, yc, tol.rtol, tol.atol, at + " forward");
    if (c.running) {
      check_close_to(rm_g, rm_c, tol.rtol, tol.atol, at + " running mean");
      check_close_to(rv_g, rv_c, tol.rtol, tol.atol, at + " running var");
    }
    if (step > 0) break;
    const Tensor gy = randn_cpu(x.shape(), seed++, dt);
    yc.backward(gy);
    yg.backward(gy.to(cuda0()));
    check_close_to(xg.grad(), xc.grad(), tol.rtol, tol.atol, at + " grad x");
    if (c.affine) {
      check_close_to(wg.grad(), wc.grad(), tol.rtol, tol.atol, at + " grad w");
      check_close_to(bg.grad(), bc.grad(), tol.rtol, tol.atol, at + " grad b");
    }
  }
}

const std::vector<BnCase> kBnCases = {
    {{8, 3}, true, true},          {{4, 3, 5, 7}, true, true},   {{4, 3, 5, 7}, false, true},
    {{2, 5, 6}, true, false},      {{3, 4, 2, 3, 2}, true, true}, {{16, 32, 9, 9}, true, true},
    {{2, 1, 1, 1}, false, false},
};

std::string bn_name(const BnCase& c) {
  return shape_str(c.x) + (c.affine ? " affine" : "") + (c.running ? " running" : "");
}

}  // namespace

TEST_CASE("CUDA batch_norm in training matches the CPU, running statistics included",
          "[gpu][cuda][norm]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::f32, DType::f64);
#if LOCKSTEP_HAVE_CUDA
  const cuda::CudnnPathStats before = cuda::batch_norm_path_stats();
#endif
  uint64_t seed = 1;
  int64_t calls = 0;  // training forwards and backwards on cuDNN
  for (const BnCase& c : kBnCases) {
    const Tensor x = randn_cpu(c.x, seed++, dt).mul_(2.0).add_(Tensor::scalar(0.5, dt));
    for (double momentum : {0.1, 0.7}) {
      check_batch_norm(c, x, x.to(cuda0()), true, momentum,
                       bn_name(c) + " momentum " + std::to_string(momentum), seed += 10);
      calls += 3;  // two steps forward, one backward
    }
  }
  const BnCase& c = kBnCases[1];
  const Tensor x = randn_cpu(c.x, seed++, dt);
  check_batch_norm(c, x, transposed_on_device(x, 0, 2), true, 0.1, "non-contiguous", seed++);
  calls += 3;
#if LOCKSTEP_HAVE_CUDA
  // Each call counted once; f32 goes through cuDNN's graph API unless the
  // legacy API is forced, f64 always takes the legacy calls.
  const cuda::CudnnPathStats after = cuda::batch_norm_path_stats();
  INFO("graph " << after.graph - before.graph << ", legacy " << after.legacy - before.legacy);
  CHECK(after.graph - before.graph + after.legacy - before.legacy == calls);
  if (dt == DType::f32 && !cuda::cudnn_legacy_forced()) {
    CHECK(after.graph > before.graph);
  } else {
    CHECK(after.graph == before.graph);
  }
#endif
}

TEST_CASE("CUDA batch_norm in eval mode matches the CPU", "[gpu][cuda][norm]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::f32, DType::f64);
  uint64_t seed = 1001;
  for (const BnCase& c : kBnCases) {
    if (!c.running) continue;  // eval needs running statistics
    const Tensor x = randn_cpu(c.x, seed++, dt);
    check_batch_norm(c, x, x.to(cuda0()), false, 0.1, bn_name(c) + " eval", seed += 10);
  }
}

namespace {

struct LnCase {
  Shape x;
  std::vector<int64_t> normalized;
};

const std::vector<LnCase> kLnCases = {
    {{4, 8}, {8}},          {{3, 5, 7}, {7}},        {{2, 3, 4, 6}, {4, 6}},
    {{2, 1000}, {1000}},    {{5, 4096}, {4096}},     {{1, 3}, {3}},
    {{300, 32}, {32}},      {{1030, 17}, {17}},      {{6, 2, 5000}, {2, 5000}},
    {{7, 1}, {1}},
};

// layer_norm on both devices, backward from one random gradient.
void check_layer_norm(const LnCase& c, const Tensor& x, const Tensor& x_dev, bool weight,
                      bool bias, Tol tol, const std::string& what, uint64_t seed) {
  const DType dt = x.dtype();
  const Tensor w = weight ? randn_cpu(c.normalized, seed++, dt) : Tensor();
  const Tensor b = bias ? randn_cpu(c.normalized, seed++, dt) : Tensor();
  Tensor xc = cpu_leaf(x), wc = cpu_leaf(w), bc = cpu_leaf(b);
  Tensor xg = x_dev.detach().requires_grad_(), wg = dev_leaf(w), bg = dev_leaf(b);
  Tensor yc = layer_norm(xc, c.normalized, wc, bc), yg = layer_norm(xg, c.normalized, wg, bg);
  CHECK(yg.device() == cuda0());
  CHECK(yg.dtype() == dt);
  check_close_to(yg, yc, tol.rtol, tol.atol, what + " forward");
  const Tensor gy = randn_cpu(x.shape(), seed++, dt);
  yc.backward(narrow(dt) ? gy.to(DType::f32) : gy);
  yg.backward(gy.to(cuda0()));
  check_close_to(xg.grad(), xc.grad(), tol.rtol, tol.atol, what + " grad x");
  if (weight) check_close_to(wg.grad(), wc.grad(), tol.rtol, tol.atol, what + " grad w");
  if (bias) check_close_to(bg.grad(), bc.grad(), tol.rtol, tol.atol, what + " grad b");
}

}  // namespace

TEST_CASE("CUDA layer_norm matches the CPU with and without affine parameters",
          "[gpu][cuda][norm]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::f32, DType::f64, DType::bf16, DType::f16);
  uint64_t seed = 2001;
  for (const LnCase& c : kLnCases) {
    const Tensor x = randn_cpu(c.x, seed++, dt);
    const std::string what = shape_str(c.x) + " over " + shape_str(c.normalized);
    check_layer_norm(c, x, x.to(cuda0()), true, true, tolerance(dt), what + " affine", seed += 10);
    check_layer_norm(c, x, x.to(cuda0()), false, false, tolerance(dt), what + " plain",
                     seed += 10);
    check_layer_norm(c, x, x.to(cuda0()), true, false, tolerance(dt), what + " weight only",
                     seed += 10);
  }
}

TEST_CASE("CUDA layer_norm of a large mean and of non-contiguous input", "[gpu][cuda][norm]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  uint64_t seed = 3001;
  const LnCase c{{16, 256}, {256}};
  const Tensor shifted = randn_cpu(c.x, seed++).add_(Tensor::scalar(1000.0));
  check_layer_norm(c, shifted, shifted.to(cuda0()), true, true, {1e-3, 1e-3}, "mean 1000",
                   seed += 10);
  const Tensor x = randn_cpu(c.x, seed++);
  check_layer_norm(c, x, transposed_on_device(x), true, true, tolerance(DType::f32),
                   "transposed", seed += 10);
  // Contiguous rows that start 4 bytes past a 16-byte boundary: the scalar
  // path, though the row length would allow vectors.
  const Tensor flat = randn_cpu({1 + 9 * 256}, seed++);
  const Tensor rows_cpu = flat.slice(0, 1, 1 + 9 * 256).contiguous().view({9, 256});
  const Tensor rows_dev = flat.to(cuda0()).slice(0, 1, 1 + 9 * 256).view({9, 256});
  REQUIRE(rows_dev.is_contiguous());
  const LnCase u{{9, 256}, {256}};
  check_layer_norm(u, rows_cpu, rows_dev, true, true, tolerance(DType::f32), "offset rows",
                   seed += 10);
}

TEST_CASE("CUDA batch_norm of an input with no channels returns it empty, as the CPU does",
          "[gpu][cuda][norm]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  // No kernel runs: cuDNN would be handed zero-sized dimensions.
  for (const bool training : {true, false}) {
    INFO("training " << training);
    const Tensor x = Tensor::zeros({4, 0, 8}, DType::f32, cuda0()).requires_grad_();
    const Tensor w = Tensor::ones({0}, DType::f32, cuda0()).requires_grad_();
    const Tensor b = Tensor::zeros({0}, DType::f32, cuda0()).requires_grad_();
    const Tensor rm = Tensor::zeros({0}, DType::f32, cuda0());
    const Tensor rv = Tensor::ones({0}, DType::f32, cuda0());
    const Tensor y = batch_norm(x, w, b, rm, rv, training);
    CHECK(y.shape() == Shape{4, 0, 8});
    CHECK(y.device() == cuda0());
    y.backward(Tensor::zeros({4, 0, 8}, DType::f32, cuda0()));
    CHECK(x.grad().shape() == Shape{4, 0, 8});
    CHECK(w.grad().shape() == Shape{0});
  }
}
