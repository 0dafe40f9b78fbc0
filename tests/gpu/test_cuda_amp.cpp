// The CUDA loss-scaling kernels against the CPU ops: unscale with inf/NaN on
// every floating dtype, contiguous and strided; the scale's update rule over
// a scripted sequence; and GradScaler training on the device (skips, scale).
// Unscaling by a power of two is exact, so results must match bit for bit.
#include <catch2/catch.hpp>

#include <limits>
#include <vector>

#include "gpu/cuda_op_check.h"
#include "lockstep/optim/grad_scaler.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/ops/amp.h"
#include "support/gpu_skip.h"
#include "support/test_util.h"

using namespace lockstep;
using namespace lockstep::runtime;
using namespace lockstep::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// n values with inf, -inf or NaN at `bad` (none when bad < 0).
Tensor grads_cpu(int64_t n, uint64_t seed, DType dtype, int64_t bad, double value) {
  std::vector<double> v = randn_cpu({n}, seed, DType::f64).to_vector<double>();
  if (bad >= 0) v[static_cast<size_t>(bad)] = value;
  return Tensor::from_vector(v, {n}).to(dtype);
}

}  // namespace

TEST_CASE("CUDA amp_unscale_ matches the CPU on every floating dtype", "[gpu][cuda_amp]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  const DType dtype = GENERATE(DType::f32, DType::f64, DType::bf16, DType::f16);
  for (const double bad : {0.0, kInf, -kInf, std::numeric_limits<double>::quiet_NaN()}) {
    INFO(dtype_name(dtype) << " bad=" << bad);
    // Sizes around the block and vector widths; the bad value in the last one.
    const std::vector<int64_t> sizes = {1, 255, 4097, 100003};
    std::vector<Tensor> cpu, dev;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int64_t at = (bad != 0.0 && i + 1 == sizes.size()) ? sizes[i] - 7 : -1;
      cpu.push_back(grads_cpu(sizes[i], 10 + i, dtype, at, bad));
      dev.push_back(i % 2 ? strided_on_device(cpu.back()) : cpu.back().to(cuda0()));
    }
    Tensor found_cpu = Tensor::zeros({1}), found_dev = Tensor::zeros({1}, DType::f32, cuda0());
    amp_unscale_(cpu, found_cpu, Tensor::full({1}, 1.0 / 1024));
    amp_unscale_(dev, found_dev, Tensor::full({1}, 1.0 / 1024, DType::f32, cuda0()));
    CHECK(found_dev.item() == found_cpu.item());
    CHECK(found_dev.item() == (bad == 0.0 ? 0.0 : 1.0));
    for (size_t i = 0; i < cpu.size(); ++i)
      check_equal_to(dev[i], cpu[i], "gradient " + std::to_string(i));
  }
}

TEST_CASE("CUDA amp_update_scale_ follows the CPU rule", "[gpu][cuda_amp]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  Tensor scale_cpu = Tensor::full({1}, 4.0), tracker_cpu = Tensor::zeros({1}, DType::i32);
  Tensor scale_dev = scale_cpu.to(cuda0()), tracker_dev = tracker_cpu.to(cuda0());
  for (int found : {0, 0, 0, 1, 0, 0, 1, 0, 0, 0}) {
    amp_update_scale_(scale_cpu, tracker_cpu, Tensor::full({1}, found), 2.0, 0.5, 3);
    amp_update_scale_(scale_dev, tracker_dev, Tensor::full({1}, found, DType::f32, cuda0()), 2.0,
                      0.5, 3);
  }
  CHECK(scale_dev.item() == scale_cpu.item());
  CHECK(tracker_dev.item() == tracker_cpu.item());
  CHECK(scale_dev.item() == 4.0);
}

TEST_CASE("GradScaler on CUDA skips an overflowed step and keeps the scale on the device",
          "[gpu][cuda_amp]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  Tensor p = Tensor::ones({3}, DType::f32, cuda0()).requires_grad_();
  optim::SGD opt({p}, {.lr = 0.5});
  optim::GradScaler scaler({.init_scale = 8, .growth_interval = 1});
  const auto iterate = [&](double x) {
    opt.zero_grad();
    scaler.scale(sum(p * Tensor::full({3}, x, DType::f32, cuda0()))).backward();
    const bool stepped = scaler.step(opt);
    scaler.update();
    return stepped;
  };
  CHECK(iterate(1.0));
  CHECK(scaler.get_scale() == 16.0);
  CHECK(values(p) == std::vector<double>{0.5, 0.5, 0.5});
  CHECK_FALSE(iterate(kInf));
  CHECK(scaler.get_scale() == 8.0);
  CHECK(values(p) == std::vector<double>{0.5, 0.5, 0.5});
}
