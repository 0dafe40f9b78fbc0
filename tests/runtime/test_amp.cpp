// The loss-scaling ops (runtime/ops/amp.h) on the CPU: unscale and flag
// inf/NaN on every floating dtype, strided views, and the scale's update rule
// step by step against PyTorch's torch._amp_update_scale_.
#include <catch2/catch.hpp>

#include <limits>
#include <vector>

#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/ops/amp.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Tensor vec(std::vector<double> v, DType dtype) {
  const auto n = static_cast<int64_t>(v.size());
  return Tensor::from_vector(v, {n}).to(dtype);
}

Tensor flag() { return Tensor::zeros({1}, DType::f32); }
Tensor inv(double v) { return Tensor::full({1}, v, DType::f32); }

}  // namespace

TEST_CASE("amp_unscale_ scales finite gradients of every floating dtype", "[amp]") {
  const DType dtype = GENERATE(DType::f32, DType::f64, DType::bf16, DType::f16);
  INFO(dtype_name(dtype));
  Tensor a = vec({1, -2, 0.5, 4}, dtype);
  Tensor b = vec({8, 0, -16}, dtype);
  const uint64_t version = a.version();
  Tensor found = flag();
  amp_unscale_({a, b}, found, inv(0.25));
  CHECK(values(a) == std::vector<double>{0.25, -0.5, 0.125, 1});
  CHECK(values(b) == std::vector<double>{2, 0, -4});
  CHECK(a.dtype() == dtype);
  CHECK(found.item() == 0);
  CHECK(a.version() > version);
}

TEST_CASE("amp_unscale_ flags inf and NaN on every floating dtype", "[amp]") {
  const DType dtype = GENERATE(DType::f32, DType::f64, DType::bf16, DType::f16);
  for (const double bad : {kInf, -kInf, kNaN}) {
    INFO(dtype_name(dtype) << " " << bad);
    Tensor clean = vec({2, 4}, dtype);
    Tensor g = vec({1, bad, 2}, dtype);
    Tensor found = flag();
    amp_unscale_({clean, g}, found, inv(0.5));
    CHECK(found.item() == 1);
    // Every element is still scaled, as PyTorch does (the step is skipped anyway).
    const auto v = values(g);
    CHECK(v[0] == 0.5);
    CHECK(v[2] == 1);
    CHECK(values(clean) == std::vector<double>{1, 2});
    // A later clean call leaves the flag set.
    Tensor more = vec({1}, dtype);
    amp_unscale_({more}, found, inv(0.5));
    CHECK(found.item() == 1);
  }
}

TEST_CASE("amp_unscale_ on a strided view touches only the view", "[amp]") {
  const DType dtype = GENERATE(DType::f32, DType::bf16);
  Tensor base = vec({1, 2, 3, 4, 5, 6}, dtype);
  Tensor every_other = base.slice(0, 0, 6, 2);
  REQUIRE_FALSE(every_other.is_contiguous());
  Tensor found = flag();
  amp_unscale_({every_other}, found, inv(2));
  CHECK(values(base) == std::vector<double>{2, 2, 6, 4, 10, 6});
  Tensor m = vec({1, 2, kInf, 4, 5, 6}, dtype).reshape({2, 3}).t();
  amp_unscale_({m}, found, inv(1));  // inv_scale 1: values as they were
  CHECK(found.item() == 1);
  CHECK(values(m.t().reshape({6}))[5] == 6);
}

TEST_CASE("amp_unscale_ refuses non-floating gradients and malformed flags", "[amp]") {
  Tensor found = flag();
  CHECK_THROWS_WITH(amp_unscale_({Tensor::zeros({3}, DType::i64)}, found, inv(1)),
                    Contains("f32, f64, bf16 or f16"));
  CHECK_THROWS_WITH(amp_unscale_({vec({1}, DType::f32)}, Tensor::zeros({1}, DType::f64), inv(1)),
                    Contains("found_inf"));
  CHECK_THROWS_WITH(amp_unscale_({vec({1}, DType::f32)}, found, Tensor::ones({2})),
                    Contains("inv_scale"));
}

TEST_CASE("amp_update_scale_ grows after growth_interval clean steps and backs off on overflow",
          "[amp]") {
  // PyTorch: torch._amp_update_scale_(scale, tracker, found_inf, 2.0, 0.5, 3).
  Tensor scale = Tensor::full({1}, 4.0, DType::f32);
  Tensor tracker = Tensor::zeros({1}, DType::i32);
  const std::vector<int> found_inf = {0, 0, 0, 1, 0, 0, 1, 0, 0, 0};
  const std::vector<double> scales = {4, 4, 8, 4, 4, 4, 2, 2, 2, 4};
  const std::vector<double> trackers = {1, 2, 0, 0, 1, 2, 0, 1, 2, 0};
  for (size_t i = 0; i < found_inf.size(); ++i) {
    INFO("iteration " << i);
    amp_update_scale_(scale, tracker, Tensor::full({1}, found_inf[i], DType::f32), 2.0, 0.5, 3);
    CHECK(scale.item() == scales[i]);
    CHECK(tracker.item() == trackers[i]);
  }
  // Growth that would overflow f32 keeps the scale; the tracker restarts.
  Tensor big = Tensor::full({1}, 0x1p127, DType::f32);
  Tensor t = Tensor::zeros({1}, DType::i32);
  amp_update_scale_(big, t, flag(), 2.0, 0.5, 1);
  CHECK(big.item() == 0x1p127);
  CHECK(t.item() == 0);
}
