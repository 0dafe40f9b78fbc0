// cross_entropy and mse_loss on CUDA against the CPU ops, forward and
// backward: every reduction, label smoothing, i64 and i32 targets, class
// counts that take the warp, block and vector paths, non-contiguous logits,
// bf16/f16 logits, ignore_index, and the NaN a bad target gives on CUDA.
// Tolerances: f32 within 1e-5 relative plus 1e-6 absolute, f64 within 1e-12;
// bf16 and f16 logits against the CPU op in f32 on the same rounded logits,
// within the output's rounding (1/128 and 1/1024 relative) plus 1e-3 (bf16)
// or 2e-4 (f16) absolute for the loss and 1e-4 absolute for the gradients.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "gpu/cuda_op_check.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/loss.h"
#include "lockstep/runtime/random.h"
#include "lockstep/runtime/tensor.h"
#include "support/gpu_skip.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

namespace {

const char* reduction_name(Reduction r) {
  return r == Reduction::Mean ? "mean" : r == Reduction::Sum ? "sum" : "none";
}

Tensor random_targets(int64_t n, int64_t c, uint64_t seed, DType dtype) {
  Generator g(seed);
  std::vector<int64_t> t(n);
  for (int64_t& v : t) v = static_cast<int64_t>(g.next_uniform() * static_cast<double>(c));
  return Tensor::from_vector<int64_t>(t, {n}).to(dtype);
}

struct Tolerance {
  double rtol, atol, grad_atol;
};

Tolerance tolerance_of(DType dt) {
  switch (dt) {
    case DType::f64: return {1e-12, 1e-12, 1e-12};
    case DType::bf16: return {1.0 / 128, 1e-3, 1e-4};
    case DType::f16: return {1.0 / 1024, 2e-4, 1e-4};
    default: return {1e-5, 1e-6, 1e-6};
  }
}

// cross_entropy forward and backward on CUDA (logits given in any layout by
// `logits_dev`) against the CPU on the same values (in f32 for 16-bit).
void check_cross_entropy(const Tensor& logits, const Tensor& logits_dev, const Tensor& target,
                         double smoothing, Reduction reduction, uint64_t seed,
                         std::optional<int64_t> ignore_index = std::nullopt) {
  const DType dt = logits.dtype();
  const bool narrow = dt == DType::bf16 || dt == DType::f16;
  const Tolerance tol = tolerance_of(dt);
  const std::string what = "logits " + shape_str(logits.shape()) + " " +
                           std::string(dtype_name(dt)) + " target " +
                           std::string(dtype_name(target.dtype())) + " smoothing " +
                           std::to_string(smoothing) + " reduction " + reduction_name(reduction) +
                           (logits_dev.is_contiguous() ? "" : " strided") +
                           (ignore_index ? " ignore_index " + std::to_string(*ignore_index) : "");
  Tensor xc = (narrow ? logits.to(DType::f32) : logits.clone()).requires_grad_();
  Tensor xg = logits_dev.detach().requires_grad_();
  Tensor lc = cross_entropy(xc, target, smoothing, reduction, ignore_index);
  Tensor lg = cross_entropy(xg, target.to(cuda0()), smoothing, reduction, ignore_index);
  CHECK(lg.device() == cuda0());
  CHECK(lg.dtype() == dt);
  check_close_to(lg, lc, tol.rtol, tol.atol, what + " forward");
  // The same gradient values on both devices (rounded to dt first).
  const Tensor gy = reduction == Reduction::None ? randn_cpu(lc.shape(), seed, dt)
                                                 : Tensor::full({}, 0.75, dt);
  lc.backward(gy.to(lc.dtype()));
  lg.backward(gy.to(cuda0()));
  REQUIRE(xg.grad().defined());
  check_close_to(xg.grad(), xc.grad(), tol.rtol, tol.grad_atol, what + " backward");
}

}  // namespace

TEST_CASE("CUDA cross_entropy matches the CPU", "[gpu][cuda][loss]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::f32, DType::f64);
  uint64_t seed = 1;
  // Classes: 2 and 10 (a few lanes of a warp), 37 (odd, scalar loads), 1000
  // (vector loads), 2048 and 5000 (a block per row).
  for (const Shape& shape : {Shape{1, 2}, Shape{7, 10}, Shape{64, 37}, Shape{300, 1000},
                             Shape{5, 2048}, Shape{3, 5000}}) {
    for (Reduction reduction : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
      for (double smoothing : {0.0, 0.1}) {
        const Tensor logits = mul(randn_cpu(shape, seed++, DType::f64), 3.0).to(dt);
        const Tensor target = random_targets(shape[0], shape[1], seed++, DType::i64);
        check_cross_entropy(logits, logits.to(cuda0()), target, smoothing, reduction, seed++);
      }
    }
  }
}

TEST_CASE("CUDA cross_entropy with i32 targets and non-contiguous logits", "[gpu][cuda][loss]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  uint64_t seed = 101;
  const Tensor logits = randn_cpu({40, 24}, seed++);
  const Tensor target = random_targets(40, 24, seed++, DType::i32);
  for (Reduction reduction : {Reduction::Mean, Reduction::None}) {
    check_cross_entropy(logits, logits.to(cuda0()), target, 0.2, reduction, seed++);
    check_cross_entropy(logits, transposed_on_device(logits), target, 0.2, reduction, seed++);
    check_cross_entropy(logits, strided_on_device(logits), target, 0.0, reduction, seed++);
  }
  // Full smoothing: the target is ignored.
  check_cross_entropy(logits, logits.to(cuda0()), target, 1.0, Reduction::Sum, seed++);
}

TEST_CASE("CUDA cross_entropy of bf16 and f16 logits computes in f32", "[gpu][cuda][loss]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::bf16, DType::f16);
  uint64_t seed = 201;
  for (const Shape& shape : {Shape{7, 10}, Shape{64, 1000}, Shape{4, 3000}}) {
    for (Reduction reduction : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
      const Tensor logits = mul(randn_cpu(shape, seed++, DType::f64), 2.0).to(dt);
      const Tensor target = random_targets(shape[0], shape[1], seed++, DType::i64);
      check_cross_entropy(logits, logits.to(cuda0()), target, 0.1, reduction, seed++);
    }
  }
}

TEST_CASE("CUDA cross_entropy: a target out of range gives NaN, not an error",
          "[gpu][cuda][loss]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const Tensor logits = randn_cpu({3, 5}, 301).to(cuda0());
  const Tensor target = Tensor::from_vector<int64_t>({1, 5, 0}, {3}).to(cuda0());
  const std::vector<double> per_row =
      cross_entropy(logits, target, 0.0, Reduction::None).to_vector<double>();
  CHECK(std::isfinite(per_row[0]));
  CHECK(std::isnan(per_row[1]));
  CHECK(std::isfinite(per_row[2]));
  CHECK(std::isnan(cross_entropy(logits, target).item()));
  CHECK_THAT(error_of([&] { cross_entropy(logits, target.to(Device::cpu())); }),
             Contains("cross_entropy"));
}

TEST_CASE("CUDA cross_entropy with ignore_index matches the CPU", "[gpu][cuda][loss]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  uint64_t seed = 401;
  for (const Shape& shape : {Shape{7, 10}, Shape{64, 1000}}) {
    for (Reduction reduction : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
      for (double smoothing : {0.0, 0.1}) {
        const Tensor logits = randn_cpu(shape, seed++);
        std::vector<int64_t> t = random_targets(shape[0], shape[1], seed++, DType::i64)
                                     .to_vector<int64_t>();
        for (size_t i = 0; i < t.size(); i += 3) t[i] = -100;  // every third sample padding
        const Tensor target = Tensor::from_vector<int64_t>(t, {shape[0]});
        check_cross_entropy(logits, logits.to(cuda0()), target, smoothing, reduction, seed++,
                            -100);
      }
    }
  }
  // Every sample ignored: 0, as on the CPU.
  const Tensor logits = randn_cpu({4, 10}, seed++).to(cuda0());
  const Tensor none = Tensor::from_vector<int64_t>({-100, -100, -100, -100}, {4}).to(cuda0());
  CHECK(cross_entropy(logits, none, 0.0, Reduction::Mean, -100).item() == 0.0);
  // An ignored row of -inf logits adds exactly 0 and gets a zero gradient
  // (no 0 * inf), with and without smoothing.
  for (double smoothing : {0.0, 0.1}) {
    const double inf = std::numeric_limits<double>::infinity();
    Tensor x = Tensor::from_vector<double>({1, 2, 0.5, -inf, -inf, -inf}, {2, 3})
                   .to(DType::f32)
                   .to(cuda0())
                   .requires_grad_();
    const Tensor t = Tensor::from_vector<int64_t>({1, -100}, {2}).to(cuda0());
    Tensor loss = cross_entropy(x, t, smoothing, Reduction::Mean, -100);
    CHECK(std::isfinite(loss.item()));
    loss.backward();
    const std::vector<float> g = x.grad().to(Device::cpu()).to_vector<float>();
    for (int j = 0; j < 3; ++j) {
      CHECK(std::isfinite(g[j]));
      CHECK(g[3 + j] == 0.0f);
    }
  }
}

TEST_CASE("CUDA mse_loss matches the CPU", "[gpu][cuda][loss]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::f32, DType::bf16);
  const bool narrow = dt == DType::bf16;
  uint64_t seed = 401;
  for (const Shape& shape : {Shape{17}, Shape{64, 33}, Shape{8, 3, 5, 5}}) {
    for (Reduction reduction : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
      const Tensor a = randn_cpu(shape, seed++, dt), b = randn_cpu(shape, seed++, dt);
      Tensor ac = (narrow ? a.to(DType::f32) : a.clone()).requires_grad_();
      Tensor ag = a.to(cuda0()).requires_grad_();
      Tensor lc = mse_loss(ac, narrow ? b.to(DType::f32) : b, reduction);
      Tensor lg = mse_loss(ag, b.to(cuda0()), reduction);
      const std::string what = shape_str(shape) + " " + reduction_name(reduction);
      // bf16: each squared difference is rounded before the reduction.
      const double rtol = narrow ? 3.0 / 128 : 1e-5, atol = narrow ? 1e-2 : 1e-5;
      check_close_to(lg, lc, rtol, atol, what + " forward");
      const Tensor gy = reduction == Reduction::None ? randn_cpu(shape, seed++, dt)
                                                     : Tensor::full({}, 1.5, dt);
      lc.backward(narrow ? gy.to(DType::f32) : gy);
      lg.backward(gy.to(cuda0()));
      check_close_to(ag.grad(), ac.grad(), rtol, atol, what + " backward");
    }
  }
}
