// matmul and linear on CUDA (cuBLAS) against the CPU ops, forward and
// backward: odd sizes, k = 0, operands stored transposed (read with
// CUBLAS_OP_T, no copy) or with a row stride larger than the row, batched
// products with a transposed or batch-broadcast operand, [.., m, k] x [k, n],
// bf16 and f16, and TF32 off by default.
// Tolerances (relative + absolute, the absolute part scaled by sqrt(k) for
// the sums' rounding): f32 1e-5 + 2e-5 sqrt(k); f64 1e-12 + 1e-12 sqrt(k);
// bf16 1/64 and f16 1/512 relative (the result is rounded once to 16 bits,
// half an ulp being 1/256 and 1/2048, with room for split-k partial sums
// cuBLAS may keep in 16 bits) + 1e-4 sqrt(k), against the CPU op in f32 on
// the same rounded inputs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "gpu/cuda_op_check.h"
#include "lockstep/config.h"
#include "lockstep/runtime/ops/linalg.h"
#include "lockstep/runtime/tensor.h"
#include "support/gpu_skip.h"
#include "support/test_util.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/runtime/cuda/ops/math_mode.h"
#endif

using namespace lockstep::runtime;
using namespace lockstep::testing;

namespace {

struct Tol {
  double rtol, atol;
};

Tol tolerance(DType dt, int64_t k) {
  const double s = std::sqrt(static_cast<double>(k) + 1.0);
  switch (dt) {
    case DType::f64: return {1e-12, 1e-12 * s};
    case DType::bf16: return {1.0 / 64, 1e-4 * s};
    case DType::f16: return {1.0 / 512, 1e-4 * s};
    default: return {1e-5, 2e-5 * s};
  }
}

bool narrow(DType dt) { return dt == DType::bf16 || dt == DType::f16; }

// The CPU reference input: f32 for the 16-bit dtypes (same rounded values).
Tensor cpu_leaf(const Tensor& t) {
  return (narrow(t.dtype()) ? t.to(DType::f32) : t.clone()).requires_grad_();
}

// op on CPU copies of `cpu` and on the device tensors `dev` (same values, any
// layout), then backward from one random gradient; compares the result and
// every input's gradient.
void check_op(const std::function<Tensor(const std::vector<Tensor>&)>& op,
              const std::vector<Tensor>& cpu, const std::vector<Tensor>& dev, Tol tol,
              const std::string& what, uint64_t seed) {
  const DType dt = cpu[0].dtype();
  std::vector<Tensor> xc, xg;
  for (const Tensor& t : cpu) xc.push_back(cpu_leaf(t));
  for (const Tensor& t : dev) xg.push_back(t.detach().requires_grad_());
  Tensor yc = op(xc), yg = op(xg);
  CHECK(yg.device() == cuda0());
  CHECK(yg.dtype() == dt);
  check_close_to(yg, yc, tol.rtol, tol.atol, what + " forward");
  const Tensor gy = randn_cpu(yc.shape(), seed, dt);
  yc.backward(narrow(dt) ? gy.to(DType::f32) : gy);
  yg.backward(gy.to(cuda0()));
  for (size_t i = 0; i < xc.size(); ++i) {
    REQUIRE(xg[i].grad().defined());
    CHECK(xg[i].grad().device() == cuda0());
    check_close_to(xg[i].grad(), xc[i].grad(), tol.rtol, tol.atol,
                   what + " grad of input " + std::to_string(i));
  }
}

Tensor matmul_of(const std::vector<Tensor>& v) { return matmul(v[0], v[1]); }

struct Dims {
  int64_t m, k, n;
};
const std::vector<Dims> kDims = {{1, 1, 1},   {1, 5, 1},   {4, 1, 3},    {1, 7, 3},
                                 {5, 3, 1},   {17, 9, 13}, {64, 33, 48}, {4, 0, 3},
                                 {3, 130, 5}, {257, 31, 129}};

std::string dims_str(const Dims& d) {
  return std::to_string(d.m) + "x" + std::to_string(d.k) + "x" + std::to_string(d.n);
}

}  // namespace

TEST_CASE("CUDA matmul of 2-D matrices matches the CPU", "[gpu][cuda][linalg]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::f32, DType::f64, DType::bf16, DType::f16);
  uint64_t seed = 1;
  for (const Dims& d : kDims) {
    const Tensor a = randn_cpu({d.m, d.k}, seed++, dt), b = randn_cpu({d.k, d.n}, seed++, dt);
    check_op(matmul_of, {a, b}, {a.to(cuda0()), b.to(cuda0())}, tolerance(dt, d.k),
             dims_str(d), seed++);
  }
}

TEST_CASE("CUDA matmul reads transposed and row-strided operands", "[gpu][cuda][linalg]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::f32, DType::f64, DType::bf16);
  uint64_t seed = 101;
  // No size-1 dims: a transposed copy of one would still be contiguous.
  for (const Dims& d : {Dims{6, 4, 5}, Dims{2, 9, 7}, Dims{33, 17, 2}, Dims{31, 65, 47}}) {
    const Tensor a = randn_cpu({d.m, d.k}, seed++, dt), b = randn_cpu({d.k, d.n}, seed++, dt);
    const Tol tol = tolerance(dt, d.k);
    const std::string what = dims_str(d);
    // Stored transposed: unit stride in dim 0.
    check_op(matmul_of, {a, b}, {transposed_on_device(a), b.to(cuda0())}, tol,
             what + " a transposed", seed++);
    check_op(matmul_of, {a, b}, {a.to(cuda0()), transposed_on_device(b)}, tol,
             what + " b transposed", seed++);
    check_op(matmul_of, {a, b}, {transposed_on_device(a), transposed_on_device(b)}, tol,
             what + " both transposed", seed++);
    // Rows twice as far apart as their length (a leading dimension > k).
    check_op(matmul_of, {a, b}, {strided_on_device(a, 0), strided_on_device(b, 0)}, tol,
             what + " row-strided", seed++);
    // Every other column: no layout cuBLAS reads, so a contiguous copy.
    check_op(matmul_of, {a, b}, {strided_on_device(a, 1), strided_on_device(b, 1)}, tol,
             what + " column-strided", seed++);
  }
}

TEST_CASE("CUDA batched matmul and [.., m, k] x [k, n] match the CPU", "[gpu][cuda][linalg]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::f32, DType::f64, DType::bf16, DType::f16);
  uint64_t seed = 201;
  for (const Shape& sa : {Shape{3, 5, 4}, Shape{1, 7, 9}, Shape{4, 1, 33}, Shape{2, 17, 31}}) {
    const int64_t k = sa[2];
    const Tensor a = randn_cpu(sa, seed++, dt), b = randn_cpu({sa[0], k, 6}, seed++, dt);
    const Tol tol = tolerance(dt, k);
    const std::string what = "batched " + shape_str(sa);
    check_op(matmul_of, {a, b}, {a.to(cuda0()), b.to(cuda0())}, tol, what, seed++);
    check_op(matmul_of, {a, b}, {a.to(cuda0()), transposed_on_device(b, 1, 2)}, tol,
             what + " b transposed per batch", seed++);
    if (sa[0] > 1 && sa[1] > 1) {
      check_op(matmul_of, {a, b}, {transposed_on_device(a, 0, 1), b.to(cuda0())}, tol,
               what + " a batch-strided", seed++);
    }
  }
  // A batch-broadcast operand (batch stride 0): forward, and the gradient of b.
  {
    const Tensor a1 = randn_cpu({1, 5, 4}, seed++, dt), b = randn_cpu({3, 4, 6}, seed++, dt);
    const Tensor ac = (narrow(dt) ? a1.to(DType::f32) : a1).expand({3, 5, 4});
    Tensor bc = cpu_leaf(b);
    Tensor bg = b.to(cuda0()).requires_grad_();
    Tensor yc = matmul(ac, bc), yg = matmul(a1.to(cuda0()).expand({3, 5, 4}), bg);
    const Tol tol = tolerance(dt, 4);
    check_close_to(yg, yc, tol.rtol, tol.atol, "expanded a forward");
    const Tensor gy = randn_cpu(yc.shape(), seed++, dt);
    yc.backward(narrow(dt) ? gy.to(DType::f32) : gy);
    yg.backward(gy.to(cuda0()));
    check_close_to(bg.grad(), bc.grad(), tol.rtol, tol.atol, "expanded a, grad of b");
  }
  // [2, 3, 5, k] x [k, n]: the rows of all leading dims in one product.
  for (const Dims& d : {Dims{5, 4, 6}, Dims{1, 33, 7}}) {
    const Tensor a = randn_cpu({2, 3, d.m, d.k}, seed++, dt), b = randn_cpu({d.k, d.n}, seed++, dt);
    check_op(matmul_of, {a, b}, {a.to(cuda0()), b.to(cuda0())}, tolerance(dt, d.k),
             "broadcast " + dims_str(d), seed++);
    check_op(matmul_of, {a, b}, {transposed_on_device(a, 0, 1), transposed_on_device(b)},
             tolerance(dt, d.k), "broadcast, non-contiguous " + dims_str(d), seed++);
  }
}

TEST_CASE("CUDA linear matches the CPU with and without bias", "[gpu][cuda][linalg]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::f32, DType::f64, DType::bf16, DType::f16);
  uint64_t seed = 301;
  struct Case {
    Shape x;
    int64_t out;
  };
  for (const Case& c : {Case{{8, 7}, 3}, Case{{2, 5, 7}, 3}, Case{{1, 1}, 1}, Case{{64, 129}, 33},
                        Case{{3, 4, 5, 16}, 10}, Case{{0, 4}, 3}}) {
    const int64_t in = c.x.back();
    const Tensor x = randn_cpu(c.x, seed++, dt), w = randn_cpu({c.out, in}, seed++, dt);
    const Tensor b = randn_cpu({c.out}, seed++, dt);
    // The weight and bias gradients sum over all rows: the larger count sets
    // the tolerance's scale.
    const int64_t rows = x.numel() / in;
    const Tol tol = tolerance(dt, std::max(in, rows));
    const std::string what = "linear " + shape_str(c.x) + " -> " + std::to_string(c.out);
    check_op([](const std::vector<Tensor>& v) { return linear(v[0], v[1], v[2]); }, {x, w, b},
             {x.to(cuda0()), w.to(cuda0()), b.to(cuda0())}, tol, what + " with bias", seed++);
    check_op([](const std::vector<Tensor>& v) { return linear(v[0], v[1]); }, {x, w},
             {x.to(cuda0()), w.to(cuda0())}, tol, what + " without bias", seed++);
    // A non-contiguous input, and a weight stored transposed (then w.t() is
    // row-major and read without CUBLAS_OP_T).
    if (c.x[0] > 1 && in > 1 && c.out > 1) {
      check_op([](const std::vector<Tensor>& v) { return linear(v[0], v[1], v[2]); }, {x, w, b},
               {transposed_on_device(x, 0, -1), transposed_on_device(w), b.to(cuda0())}, tol,
               what + " transposed input and weight", seed++);
    }
  }
}

TEST_CASE("CUDA matmul is f32-accurate unless TF32 is allowed", "[gpu][cuda][linalg]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
#if LOCKSTEP_HAVE_CUDA
  poison_device_memory();
  CHECK_FALSE(cuda::allow_tf32());  // off by default
  // Sums of 1024 products: TF32 (10 mantissa bits in) is off by ~1e-2 here,
  // plain f32 by ~1e-5.
  const Tensor a = randn_cpu({128, 1024}, 401), b = randn_cpu({1024, 96}, 402);
  const Tensor want = matmul(a.to(DType::f64), b.to(DType::f64));
  check_close_to(matmul(a.to(cuda0()), b.to(cuda0())), want, 1e-5, 2e-4, "TF32 off");
  check_close_to(linear(a.to(cuda0()), b.t().contiguous().to(cuda0())), want, 1e-5, 2e-4,
                 "TF32 off, linear");
  cuda::set_allow_tf32(true);
  CHECK(cuda::allow_tf32());
  const Tensor fast = matmul(a.to(cuda0()), b.to(cuda0()));
  cuda::set_allow_tf32(false);
  // TF32 is a precision floor, not a promise: only check it is still close.
  check_close_to(fast, want, 1e-2, 0.5, "TF32 on");
  check_close_to(matmul(a.to(cuda0()), b.to(cuda0())), want, 1e-5, 2e-4, "TF32 off again");
#endif
}

TEST_CASE("CUDA matmul and linear refuse operands on different devices", "[gpu][cuda][linalg]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  const Tensor a = randn_cpu({3, 4}, 501), b = randn_cpu({4, 2}, 502);
  CHECK_THAT(error_of([&] { matmul(a.to(cuda0()), b); }),
             Catch::Contains("different devices"));
  CHECK_THAT(error_of([&] { linear(a, b.t().contiguous().to(cuda0())); }),
             Catch::Contains("different devices"));
  CHECK_THAT(error_of([&] { linear(a.to(cuda0()), b.t().contiguous().to(cuda0()),
                                   Tensor::zeros({2})); }),
             Catch::Contains("different devices"));
}
