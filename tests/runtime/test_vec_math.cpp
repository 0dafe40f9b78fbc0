// runtime/cpu/vec_math: exp_lanes and erf_lanes against libm's double
// results, over sweeps of f32 bit patterns, and their special values.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "lockstep/runtime/cpu/vec_math.h"

using namespace lockstep::runtime::cpu;

namespace {

constexpr int L = kLanes<float>;

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

uint32_t to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// |got - want| in units of the last place of the f32 nearest to want.
double ulps(float got, double want) {
  const float w = static_cast<float>(want);
  const double ulp = std::nextafter(std::fabs(w), std::numeric_limits<float>::infinity()) -
                     std::fabs(w);
  return std::fabs(got - want) / ulp;
}

// f applied to each of xs through the lanes.
template <class F>
std::vector<float> through_lanes(F f, const std::vector<float>& xs) {
  std::vector<float> out(xs.size());
  for (size_t i = 0; i < xs.size(); i += L) {
    float in[L] = {}, res[L];
    for (size_t u = 0; u < L && i + u < xs.size(); ++u) in[u] = xs[i + u];
    store(res, f(load(in)));
    for (size_t u = 0; u < L && i + u < xs.size(); ++u) out[i + u] = res[u];
  }
  return out;
}

}  // namespace

TEST_CASE("erf_lanes is within 1.3 ulp of erf over f32 values of both signs",
          "[runtime][cpu][vec_math]") {
  // Every 211th f32 in [0, 6) (past 3.92 erf rounds to 1), and the worst case
  // of an exhaustive search (0.91714257, just below the pieces' seam).
  std::vector<float> xs{0.91714257f, 0.921875f, std::nextafter(0.921875f, 0.0f), 4.0f};
  for (uint32_t b = 0; b < to_bits(6.0f); b += 211) xs.push_back(from_bits(b));
  const size_t n = xs.size();
  for (size_t i = 0; i < n; ++i) xs.push_back(-xs[i]);
  const std::vector<float> got = through_lanes(erf_lanes, xs);
  double worst = 0;
  float worst_x = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double e = ulps(got[i], std::erf(static_cast<double>(xs[i])));
    if (e > worst) worst = e, worst_x = xs[i];
  }
  INFO("worst " << worst << " ulp at x = " << worst_x);
  CHECK(worst <= 1.3);
  // Odd, exactly.
  size_t not_odd = 0;
  for (size_t i = 0; i < n; ++i) not_odd += got[n + i] != -got[i];
  CHECK(not_odd == 0);
}

TEST_CASE("erf_lanes at its special values", "[runtime][cpu][vec_math]") {
  const float inf = std::numeric_limits<float>::infinity();
  const auto got = through_lanes(erf_lanes, {0.0f, -0.0f, inf, -inf, std::nanf(""), 1e-40f,
                                             100.0f, -3.9f});
  CHECK(got[0] == 0.0f);
  CHECK(std::signbit(got[1]));
  CHECK(got[2] == 1.0f);
  CHECK(got[3] == -1.0f);
  CHECK(std::isnan(got[4]));
  CHECK(got[5] == Approx(1e-40 * 2 / std::sqrt(M_PI)).epsilon(1e-3));  // subnormal: x 2/sqrt(pi)
  CHECK(got[6] == 1.0f);
  CHECK(got[7] == static_cast<float>(std::erf(-3.9)));
}

TEST_CASE("exp_lanes is within 1 ulp of exp on [-87, 0], 0 below, NaN through",
          "[runtime][cpu][vec_math]") {
  std::vector<float> xs;
  for (uint32_t b = 0x80000000u; b <= to_bits(-87.0f); b += 173) xs.push_back(from_bits(b));
  const std::vector<float> got = through_lanes(exp_lanes, xs);
  double worst = 0;
  for (size_t i = 0; i < xs.size(); ++i)
    worst = std::max(worst, ulps(got[i], std::exp(static_cast<double>(xs[i]))));
  CHECK(worst <= 1.0);
  const float inf = std::numeric_limits<float>::infinity();
  const auto special =
      through_lanes(exp_lanes, {-87.5f, -1e30f, -inf, std::nanf(""), 0.0f, -0.0f});
  CHECK(special[0] == 0.0f);
  CHECK(special[1] == 0.0f);
  CHECK(special[2] == 0.0f);
  CHECK(std::isnan(special[3]));
  CHECK(special[4] == 1.0f);
  CHECK(special[5] == 1.0f);
}

TEST_CASE("exp_shifted: each exp within 1 ulp, the sum, tails, -inf to 0, in place or sum only",
          "[runtime][cpu][vec_math]") {
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t n = 1; n <= 11; ++n) {
    INFO("n = " << n);
    std::vector<float> in(n), out(n);
    for (int64_t i = 0; i < n; ++i) in[i] = -0.37f * static_cast<float>(i * i % 7) - 0.1f;
    if (n > 2) in[n - 2] = -inf;  // a masked entry, in the tail or the body
    const float shift = 0.25f;
    const float sum = exp_shifted(in.data(), out.data(), n, shift);
    double want_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double want = std::exp(static_cast<double>(in[i] - shift));
      want_sum += want;
      if (std::isinf(in[i]))
        CHECK(out[i] == 0.0f);
      else
        CHECK(ulps(out[i], want) <= 1.0);
    }
    CHECK(sum == Approx(want_sum).epsilon(1e-6));
    CHECK(exp_shifted(in.data(), nullptr, n, shift) == sum);  // the sum alone: the same bits
    std::vector<float> same = in;
    CHECK(exp_shifted(same.data(), same.data(), n, shift) == sum);  // in place
    CHECK(same == out);
  }
}
