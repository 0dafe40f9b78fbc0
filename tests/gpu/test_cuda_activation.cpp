// relu, gelu, sigmoid, tanh, softmax and log_softmax on CUDA against the CPU
// ops, forward and backward: odd sizes, rows that take the warp, block and
// vector paths, softmax over the first, a middle and the last dim,
// non-contiguous inputs, -inf and large logits, and bf16/f16.
// Tolerances: f32 within 1e-5 relative plus 1e-5 absolute (libm vs CUDA's
// exp/erf/tanh, and f32 row sums where the CPU sums in f64), f64 within 1e-12;
// bf16 and f16 within the output's rounding (1/128, 1/1024 relative) plus
// 1e-3 absolute: forward against the CPU op in f32 on the same rounded
// inputs, backward against the gradient formula in f64 applied to the
// rounded forward output that the CUDA backward itself starts from.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "gpu/cuda_op_check.h"
#include "lockstep/runtime/ops/activation.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/reduce.h"
#include "lockstep/runtime/tensor.h"
#include "support/gpu_skip.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;

namespace {

using UnaryFn = std::function<Tensor(const Tensor&)>;
// Input gradient from (x, y = fn(x), dy), all f64 on the CPU.
using GradFn = std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>;

struct Named {
  const char* name;
  UnaryFn fn;
  GradFn grad;
};

const std::vector<Named> kPointwise = {
    {"relu", [](const Tensor& x) { return relu(x); },
     [](const Tensor&, const Tensor& y, const Tensor& gy) {
       return mul(gy, gt(y, Tensor::zeros({}, DType::f64)).to(DType::f64));
     }},
    {"gelu", [](const Tensor& x) { return gelu(x); },
     [](const Tensor& x, const Tensor&, const Tensor& gy) {
       Tensor xg = x.detach().requires_grad_();
       gelu(xg).backward(gy);
       return xg.grad();
     }},
    {"sigmoid", [](const Tensor& x) { return sigmoid(x); },
     [](const Tensor&, const Tensor& y, const Tensor& gy) {
       return mul(mul(gy, y), add(neg(y), 1.0));
     }},
    {"tanh", [](const Tensor& x) { return tanh(x); },
     [](const Tensor&, const Tensor& y, const Tensor& gy) {
       return mul(gy, add(neg(mul(y, y)), 1.0));
     }},
};

GradFn softmax_grad(int64_t dim, bool log) {
  return [dim, log](const Tensor&, const Tensor& y, const Tensor& gy) {
    if (log) return sub(gy, mul(exp(y), sum(gy, {dim}, true)));
    return mul(y, sub(gy, sum(mul(gy, y), {dim}, true)));
  };
}

double rtol_of(DType dt) {
  switch (dt) {
    case DType::f64: return 1e-12;
    case DType::bf16: return 1.0 / 128;
    case DType::f16: return 1.0 / 1024;
    default: return 1e-5;
  }
}

double atol_of(DType dt) {
  return dt == DType::f64 ? 1e-12 : dt == DType::f32 ? 1e-5 : 1e-3;
}

// fn forward and backward on CUDA from `x_dev` (x's values, any layout)
// against the CPU (see the tolerances above; `grad` is the 16-bit reference).
void check_op(const char* name, const UnaryFn& fn, const GradFn& grad, const Tensor& x,
              const Tensor& x_dev, uint64_t seed) {
  const DType dt = x.dtype();
  const bool narrow = dt == DType::bf16 || dt == DType::f16;
  Tensor xc = (narrow ? x.to(DType::f32) : x.clone()).requires_grad_();
  Tensor xg = x_dev.detach().requires_grad_();
  Tensor yc = fn(xc);
  Tensor yg = fn(xg);
  CHECK(yg.device() == cuda0());
  CHECK(yg.dtype() == dt);
  const std::string what = std::string(name) + " " + shape_str(x.shape()) + " " +
                           std::string(dtype_name(dt)) + (x_dev.is_contiguous() ? "" : " strided");
  check_close_to(yg, yc, rtol_of(dt), atol_of(dt), what + " forward");
  const Tensor gy = randn_cpu(yc.shape(), seed, dt);
  yg.backward(gy.to(cuda0()));
  REQUIRE(xg.grad().defined());
  if (narrow) {
    const Tensor want = grad(x.to(DType::f64), yg.detach().to(Device::cpu()).to(DType::f64),
                             gy.to(DType::f64));
    check_close_to(xg.grad(), want, rtol_of(dt), atol_of(dt), what + " backward");
  } else {
    yc.backward(gy);
    check_close_to(xg.grad(), xc.grad(), rtol_of(dt), atol_of(dt), what + " backward");
  }
}

}  // namespace

TEST_CASE("CUDA pointwise activations match the CPU", "[gpu][cuda][activation]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::f32, DType::f64, DType::bf16, DType::f16);
  uint64_t seed = 1;
  for (const Named& op : kPointwise) {
    for (const Shape& shape : {Shape{1}, Shape{7, 13}, Shape{3, 5, 64}, Shape{1000, 37}}) {
      const Tensor x = mul(randn_cpu(shape, seed++, DType::f64), 3.0).to(dt);
      check_op(op.name, op.fn, op.grad, x, x.to(cuda0()), seed++);
    }
    if (dt == DType::f32 || dt == DType::f64) {
      const Tensor x = randn_cpu({33, 20}, seed++, dt);
      check_op(op.name, op.fn, op.grad, x, transposed_on_device(x), seed++);
      check_op(op.name, op.fn, op.grad, x, strided_on_device(x), seed++);
    }
  }
}

TEST_CASE("CUDA softmax and log_softmax match the CPU over every dim", "[gpu][cuda][activation]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::f32, DType::f64, DType::bf16, DType::f16);
  struct Case {
    Shape shape;
    int64_t dim;
  };
  uint64_t seed = 101;
  // Rows of 13 (scalar), 64 and 4096 (vector loads), 1030 and 5000 (a block
  // per row), a single row, and softmax over non-last dims (strided kernel).
  for (const Case& c : {Case{{7, 13}, 1}, Case{{5, 64}, -1}, Case{{4, 1030}, 1},
                        Case{{3, 4096}, 1}, Case{{2, 5000}, 1}, Case{{1, 7}, 1},
                        Case{{7, 13}, 0}, Case{{2, 3, 5, 7}, 0}, Case{{2, 3, 5, 7}, 1},
                        Case{{2, 3, 5, 7}, 2}, Case{{2, 3, 5, 7}, 3}, Case{{9}, 0}}) {
    for (bool log : {false, true}) {
      const int64_t dim = c.dim;
      const UnaryFn fn = [dim, log](const Tensor& x) {
        return log ? log_softmax(x, dim) : softmax(x, dim);
      };
      const GradFn grad = softmax_grad(dim, log);
      const char* name = log ? "log_softmax" : "softmax";
      const Tensor x = mul(randn_cpu(c.shape, seed++, DType::f64), 4.0).to(dt);
      INFO("dim " << c.dim);
      check_op(name, fn, grad, x, x.to(cuda0()), seed++);
      // A transposed layout needs two dims longer than 1 (else it is contiguous).
      const bool transposable =
          c.shape.size() >= 2 && c.shape.front() > 1 && c.shape.back() > 1;
      if (transposable && (dt == DType::f32 || dt == DType::f64)) {
        check_op(name, fn, grad, x, transposed_on_device(x), seed++);
        check_op(name, fn, grad, x, strided_on_device(x, 0), seed++);
      }
    }
  }
}

TEST_CASE("CUDA softmax subtracts the row maximum and handles -inf", "[gpu][cuda][activation]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const double inf = INFINITY;
  // Large logits (exp would overflow without the max), -inf entries, a row of
  // equal values, and a row that is all -inf (NaN on both devices).
  const std::vector<double> v = {1e4,  1e4 - 1, 1e4 - 3, -1e4, 0,    //
                                 -inf, 2,       -inf,    1,    -inf,  //
                                 5,    5,       5,       5,    5,     //
                                 -inf, -inf,    -inf,    -inf, -inf};
  const Tensor x = Tensor::from_vector<double>(v, {4, 5}).to(DType::f32);
  for (int64_t dim : {1, 0}) {
    const Tensor xd = dim == 1 ? x : x.t().contiguous();
    check_close_to(softmax(xd.to(cuda0()), dim), softmax(xd, dim), 2e-6, 2e-6,
                   "softmax dim " + std::to_string(dim));
    check_close_to(log_softmax(xd.to(cuda0()), dim), log_softmax(xd, dim), 2e-6, 2e-6,
                   "log_softmax dim " + std::to_string(dim));
  }
}
