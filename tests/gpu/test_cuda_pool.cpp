// max_pool2d, avg_pool2d and adaptive_avg_pool2d on CUDA against the CPU ops,
// forward and backward: padding, strides smaller and larger than the kernel
// (overlapping and gapped windows), odd sizes, 3-D inputs, many ties for max
// (the first maximum takes the gradient), adaptive windows that overlap,
// non-contiguous inputs, and bf16/f16.
// Tolerances: max pooling is exact (values, and gradients summed in the same
// order as the CPU); average pooling f32 within 1e-6 relative plus 1e-6
// absolute, f64 within 1e-12; bf16/f16 max pooling exact against the CPU op
// in f32 on the same rounded input, average pooling within 1/128 (bf16) and
// 1/1024 (f16) relative plus 1e-3 absolute.
#include <catch2/catch.hpp>

#include <array>
#include <functional>
#include <string>
#include <vector>

#include "gpu/cuda_op_check.h"
#include "lockstep/runtime/ops/pool.h"
#include "lockstep/runtime/tensor.h"
#include "support/gpu_skip.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;

namespace {

std::string describe(const Shape& shape, const Pool2dOptions& o) {
  return shape_str(shape) + " kernel [" + std::to_string(o.kernel[0]) + ", " +
         std::to_string(o.kernel[1]) + "] stride [" + std::to_string(o.stride[0]) + ", " +
         std::to_string(o.stride[1]) + "] padding [" + std::to_string(o.padding[0]) + ", " +
         std::to_string(o.padding[1]) + "]";
}

struct PoolCase {
  Shape shape;
  Pool2dOptions options;
};

const std::vector<PoolCase> kCases = {
    {{2, 3, 8, 8}, {{2, 2}, {0, 0}, {0, 0}}},  // the common 2x2 / 2
    {{2, 3, 9, 7}, {{2, 2}, {0, 0}, {0, 0}}},  // odd sizes: the last row and column unused
    {{1, 2, 7, 9}, {{3, 3}, {2, 2}, {1, 1}}},  // padded, overlapping
    {{2, 2, 6, 10}, {{3, 2}, {1, 2}, {1, 0}}}, // stride 1 rows: heavy overlap
    {{3, 5, 6}, {{2, 3}, {3, 1}, {0, 1}}},     // 3-D input, gaps between row windows
    {{1, 1, 32, 32}, {{5, 5}, {1, 1}, {2, 2}}},
};

// y = op(x) and its input gradient on both devices; `narrow` inputs run the
// CPU op in f32 on the same rounded values.
void check_pool(const std::function<Tensor(const Tensor&)>& op, const Tensor& x,
                const Tensor& x_dev, double rtol, double atol, const std::string& what,
                uint64_t seed) {
  const DType dt = x.dtype();
  const bool narrow = dt == DType::bf16 || dt == DType::f16;
  Tensor xc = (narrow ? x.to(DType::f32) : x.clone()).requires_grad_();
  Tensor xg = x_dev.detach().requires_grad_();
  Tensor yc = op(xc), yg = op(xg);
  CHECK(yg.device() == cuda0());
  CHECK(yg.dtype() == dt);
  check_close_to(yg, yc, rtol, atol, what + " forward");
  const Tensor gy = randn_cpu(yc.shape(), seed, dt);
  yc.backward(narrow ? gy.to(DType::f32) : gy);
  yg.backward(gy.to(cuda0()));
  REQUIRE(xg.grad().defined());
  check_close_to(xg.grad(), xc.grad(), rtol, atol, what + " backward");
}

}  // namespace

TEST_CASE("CUDA max_pool2d matches the CPU, ties and gradients included", "[gpu][cuda][pool]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::f32, DType::f64);
  uint64_t seed = 1;
  for (const PoolCase& c : kCases) {
    const auto op = [&](const Tensor& x) { return max_pool2d(x, c.options); };
    for (bool ties : {false, true}) {
      const Tensor x =
          ties ? small_ints_cpu(c.shape, seed++, 2, dt) : randn_cpu(c.shape, seed++, dt);
      const std::string what = describe(c.shape, c.options) + (ties ? " ties" : "");
      check_pool(op, x, x.to(cuda0()), 0.0, 0.0, what, seed++);
    }
  }
  const PoolCase& c = kCases[2];
  const Tensor x = small_ints_cpu(c.shape, seed++, 2, dt);
  const auto op = [&](const Tensor& t) { return max_pool2d(t, c.options); };
  check_pool(op, x, transposed_on_device(x, 2, 3), 0.0, 0.0, "transposed H and W", seed++);
  check_pool(op, x, strided_on_device(x, 1), 0.0, 0.0, "every other channel", seed++);
}

TEST_CASE("CUDA avg_pool2d matches the CPU", "[gpu][cuda][pool]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::f32, DType::f64);
  const double tol = dt == DType::f64 ? 1e-12 : 1e-6;
  uint64_t seed = 101;
  for (const PoolCase& c : kCases) {
    const auto op = [&](const Tensor& x) { return avg_pool2d(x, c.options); };
    const Tensor x = randn_cpu(c.shape, seed++, dt);
    check_pool(op, x, x.to(cuda0()), tol, tol, describe(c.shape, c.options), seed++);
  }
  const PoolCase& c = kCases[3];
  const Tensor x = randn_cpu(c.shape, seed++, dt);
  const auto op = [&](const Tensor& t) { return avg_pool2d(t, c.options); };
  check_pool(op, x, transposed_on_device(x, 0, 1), tol, tol, "transposed N and C", seed++);
}

TEST_CASE("CUDA adaptive_avg_pool2d matches the CPU", "[gpu][cuda][pool]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::f32, DType::f64);
  const double tol = dt == DType::f64 ? 1e-12 : 1e-6;
  struct Case {
    Shape shape;
    std::array<int64_t, 2> out;
  };
  uint64_t seed = 201;
  // Global pooling, exact and inexact divisions, identity, an output larger
  // than the input (windows overlap), a 3-D input.
  for (const Case& c : {Case{{2, 3, 7, 7}, {1, 1}}, Case{{2, 3, 7, 7}, {3, 3}},
                        Case{{1, 2, 9, 11}, {4, 5}}, Case{{1, 2, 8, 8}, {4, 2}},
                        Case{{2, 1, 7, 7}, {7, 7}}, Case{{1, 2, 4, 4}, {5, 3}},
                        Case{{3, 10, 6}, {3, 4}}}) {
    const auto op = [&](const Tensor& x) { return adaptive_avg_pool2d(x, c.out); };
    const Tensor x = randn_cpu(c.shape, seed++, dt);
    const std::string what = shape_str(c.shape) + " to [" + std::to_string(c.out[0]) + ", " +
                             std::to_string(c.out[1]) + "]";
    check_pool(op, x, x.to(cuda0()), tol, tol, what, seed++);
    if (c.shape.size() == 4)
      check_pool(op, x, strided_on_device(x, 2), tol, tol, what + " strided", seed++);
  }
}

TEST_CASE("CUDA pooling of bf16 and f16 computes in f32", "[gpu][cuda][pool]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::bf16, DType::f16);
  const double rtol = dt == DType::bf16 ? 1.0 / 128 : 1.0 / 1024;
  uint64_t seed = 301;
  for (const PoolCase& c : {kCases[0], kCases[2], kCases[3]}) {
    const Tensor x = randn_cpu(c.shape, seed++, dt);
    // Max: the values are exact and so is each gradient, a single element
    // routed unchanged unless windows overlap (then summed in f32 and rounded).
    check_pool([&](const Tensor& t) { return max_pool2d(t, c.options); }, x, x.to(cuda0()), rtol,
               1e-3, "max " + describe(c.shape, c.options), seed++);
    check_pool([&](const Tensor& t) { return avg_pool2d(t, c.options); }, x, x.to(cuda0()), rtol,
               1e-3, "avg " + describe(c.shape, c.options), seed++);
  }
  const Tensor x = randn_cpu({2, 3, 9, 11}, seed++, dt);
  check_pool([](const Tensor& t) { return adaptive_avg_pool2d(t, {4, 5}); }, x, x.to(cuda0()),
             rtol, 1e-3, "adaptive", seed++);
}
