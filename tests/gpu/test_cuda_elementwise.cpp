// CUDA tensors against the CPU: copies between devices and dtypes, fill, the
// in-place ops, and the elementwise ops of runtime/ops/elementwise.h forward
// and backward, on contiguous, strided and broadcast operands. Outputs start
// poisoned (NaN), so an element a kernel does not write fails.
//
// Tolerances: copies, fill, comparisons and integer arithmetic are exact;
// f32 add/sub/mul/div are exact too (one IEEE operation, same as the CPU),
// except a + alpha * b, which the device may fuse into one FMA (1e-6);
// exp, log, sqrt, pow and the backward formulas within 2e-6 relative (CUDA's
// math functions are within 2 ulp); bf16 and f16 results within one rounding
// of the f32 result (2^-8 and 2^-11 relative).
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "gpu/cuda_op_check.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/ops.h"
#include "support/gpu_skip.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;

TEST_CASE("CUDA tensors round-trip every dtype through the device", "[gpu][cuda_tensor]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const Tensor base = small_ints_cpu({5, 7}, 1, 3, DType::f64);
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64,
                   DType::u8, DType::boolean}) {
    INFO("dtype " << dtype_name(dt));
    const Tensor cpu = base.to(dt);
    const Tensor dev = cpu.to(cuda0());
    CHECK(dev.device() == cuda0());
    check_equal_to(dev.to(Device::cpu()), cpu, "round trip");
    check_equal_to(dev, cpu, "to_vector reads through the host");
  }
}

TEST_CASE("copy_ converts dtypes and broadcasts on and across devices", "[gpu][cuda_tensor]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  NoGradGuard no_grad;
  const Tensor x = randn_cpu({4, 6}, 2);
  for (DType dt : {DType::f64, DType::bf16, DType::f16, DType::i32, DType::boolean}) {
    INFO("to " << dtype_name(dt));
    check_equal_to(x.to(cuda0()).to(dt), x.to(dt), "conversion on the device");
  }
  // Into a strided device view from a CPU tensor, and broadcast from a row.
  Tensor big = Tensor::zeros({4, 12}, DType::f32, cuda0());
  Tensor view = big.slice(1, 0, 12, 2);
  view.copy_(x);
  check_equal_to(view, x, "host to strided device view");
  check_equal_to(big.slice(1, 1, 12, 2), Tensor::zeros({4, 6}), "untouched neighbours");
  Tensor row = Tensor::empty({4, 6}, DType::f32, cuda0());
  row.copy_(x.select(0, 1));
  check_equal_to(row, x.select(0, 1).unsqueeze(0).expand({4, 6}), "broadcast row");
  // From a transposed device tensor into a strided host view.
  Tensor host = Tensor::zeros({6, 8});
  Tensor host_view = host.slice(1, 1, 5);
  host_view.copy_(transposed_on_device(x.t().contiguous()).slice(1, 0, 4));
  check_equal_to(host_view, x.t().slice(1, 0, 4), "device to strided host view");
}

TEST_CASE("fill_, zeros, ones and the in-place ops on CUDA", "[gpu][cuda_tensor]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  NoGradGuard no_grad;
  check_equal_to(Tensor::zeros({3, 5}, DType::f32, cuda0()), Tensor::zeros({3, 5}), "zeros");
  check_equal_to(Tensor::ones({7}, DType::bf16, cuda0()), Tensor::ones({7}), "ones");
  check_equal_to(Tensor::full({2, 2}, 2.5, DType::f16, cuda0()), Tensor::full({2, 2}, 2.5), "full");
  const Tensor a = randn_cpu({5, 8}, 3), b = randn_cpu({8}, 4);
  Tensor d = a.to(cuda0());
  Tensor c = a.clone();
  d.add_(b.to(cuda0()), 0.5);
  c.add_(b, 0.5);
  check_close_to(d, c, 1e-6, 1e-6, "add_ with alpha, broadcast (FMA or not)");
  d.mul_(b.to(cuda0()));
  c.mul_(b);
  check_close_to(d, c, 1e-6, 1e-6, "mul_ broadcast");
  d.mul_(-3.0);
  c.mul_(-3.0);
  check_close_to(d, c, 1e-6, 1e-6, "mul_ by a scalar");
  Tensor strided = strided_on_device(a);
  strided.fill_(1.25);
  check_equal_to(strided, Tensor::full({5, 8}, 1.25), "fill_ of a strided view");
}

TEST_CASE("CUDA binary ops match the CPU with broadcasting and strides", "[gpu][cuda_elementwise]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const Tensor a = randn_cpu({6, 1, 9}, 5), b = randn_cpu({4, 9}, 6);
  const Tensor da = a.to(cuda0()), db = transposed_on_device(b);
  check_equal_to(add(da, db), add(a, b), "add");
  check_close_to(add(da, db, -0.75), add(a, b, -0.75), 1e-6, 1e-6, "add alpha (FMA or not)");
  check_equal_to(sub(da, db), sub(a, b), "sub");
  check_equal_to(mul(da, db), mul(a, b), "mul");
  check_equal_to(div(da, db), div(a, b), "div");
  check_equal_to(eq(da, da), eq(a, a), "eq");
  check_equal_to(gt(da, db), gt(a, b), "gt");
  check_equal_to(add(da, 1.5), add(a, 1.5), "add scalar");
  check_equal_to(mul(da, -2.0), mul(a, -2.0), "mul scalar");
  check_equal_to(neg(da), neg(a), "neg");
  // A 0-dim CPU tensor is a scalar operand of a CUDA op.
  check_equal_to(mul(da, Tensor::scalar(3.0)), mul(a, Tensor::scalar(3.0)), "CPU scalar operand");
  // Integers.
  const Tensor ia = small_ints_cpu({3, 4}, 7, 5, DType::i64), ib = small_ints_cpu({4}, 8, 5, DType::i64);
  check_equal_to(add(ia.to(cuda0()), ib.to(cuda0())), add(ia, ib), "i64 add");
  check_equal_to(mul(ia.to(cuda0()), ib.to(cuda0())), mul(ia, ib), "i64 mul");
  // Mixed devices (other than a CPU scalar) are refused.
  CHECK_THROWS_WITH(add(da, b), Catch::Contains("move one with .to("));
}

TEST_CASE("CUDA unary ops match the CPU, in f32, f64 and half precision", "[gpu][cuda_elementwise]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const Tensor x = randn_cpu({33, 17}, 9);
  const Tensor pos = add(abs(x), 0.1);
  for (DType dt : {DType::f32, DType::f64}) {
    INFO("dtype " << dtype_name(dt));
    const Tensor c = x.to(dt), p = pos.to(dt);
    const Tensor dc = strided_on_device(c), dp = p.to(cuda0());
    check_close_to(exp(dc), exp(c), 2e-6, 0, "exp");
    check_close_to(log(dp), log(p), 2e-6, 1e-7, "log");
    check_close_to(sqrt(dp), sqrt(p), 2e-6, 0, "sqrt");
    check_close_to(pow(dp, 1.7), pow(p, 1.7), 4e-6, 0, "pow");
    check_equal_to(pow(dc, 2.0), pow(c, 2.0), "square");
    check_equal_to(abs(dc), abs(c), "abs");
  }
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO("dtype " << dtype_name(dt));
    const double rel = dt == DType::bf16 ? 1.0 / 256 : 1.0 / 2048;
    // f16's subnormals (below 6.1e-5) are 2^-24 apart: a product that small
    // is rounded to that absolute step, not to a relative one.
    const double step = dt == DType::f16 ? std::ldexp(1.0, -24) : 0.0;
    const Tensor rounded = x.to(dt).to(DType::f32);  // the inputs the device sees
    const Tensor d = x.to(dt).to(cuda0());
    check_close_to(exp(d), exp(rounded), rel, step, "exp");
    check_close_to(add(d, d), add(rounded, rounded), rel, step, "add");
    check_close_to(mul(d, d), mul(rounded, rounded), rel, step, "mul");
    CHECK(exp(d).dtype() == dt);
  }
}

TEST_CASE("CUDA elementwise backward matches the CPU", "[gpu][cuda_elementwise]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const Tensor a0 = randn_cpu({5, 6}, 10), b0 = add(abs(randn_cpu({6}, 11)), 0.5);
  const Tensor g0 = randn_cpu({5, 6}, 12);
  auto run = [&](Device dev) {
    Tensor a = a0.to(dev).detach().requires_grad_();
    Tensor b = b0.to(dev).detach().requires_grad_();
    Tensor y = add(mul(exp(div(a, b)), sqrt(b)), pow(sub(a, b), 3.0));
    y.backward(g0.to(dev));
    return std::vector<Tensor>{y.detach(), a.grad(), b.grad()};
  };
  const auto cpu = run(Device::cpu());
  const auto dev = run(cuda0());
  check_close_to(dev[0], cpu[0], 1e-5, 1e-6, "forward");
  check_close_to(dev[1], cpu[1], 1e-5, 1e-6, "grad a");
  check_close_to(dev[2], cpu[2], 1e-5, 1e-6, "grad b (summed over the broadcast dim)");
  CHECK(dev[1].device() == cuda0());
}

TEST_CASE("to(Device) is differentiable", "[gpu][cuda_tensor]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  Tensor x = randn_cpu({3, 4}, 13).requires_grad_();
  Tensor y = mul(x.to(cuda0()), 2.0);
  y.backward(Tensor::ones({3, 4}, DType::f32, cuda0()));
  REQUIRE(x.grad().defined());
  CHECK(x.grad().device() == Device::cpu());
  check_equal_to(x.grad(), Tensor::full({3, 4}, 2.0), "gradient back on the CPU");
}

// Each view's backward builds its gradient on the view's device (a CPU
// buffer here once sent a host gradient into the GPT's graph on CUDA).
TEST_CASE("the views' gradients stay on the CUDA device and equal the CPU's",
          "[gpu][cuda_tensor]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  const Tensor x = randn_cpu({4, 6}, 17);
  const Tensor gy = randn_cpu({2, 3}, 18);
  const auto run = [&](Device device) {
    Tensor leaf = x.to(device).detach().requires_grad_();
    // slice with a step, select, transpose, unsqueeze + expand, permute, reshape
    Tensor v = leaf.slice(1, 1, 6, 2).slice(0, 1, 3);  // [2, 3]
    Tensor w = leaf.select(0, 3).slice(0, 0, 3).unsqueeze(0).expand({2, 3});
    Tensor t = leaf.transpose(0, 1).permute({1, 0}).reshape({8, 3}).slice(0, 0, 2);
    sum(mul(add(add(v, w), t), gy.to(device))).backward();
    return leaf.grad();
  };
  const Tensor got = run(cuda0()), want = run(Device::cpu());
  CHECK(got.device() == cuda0());
  check_equal_to(got, want, "gradient through slice, select, expand, transpose, permute");
}
