// runtime/cpu/vec_math: exp_lanes and erf_lanes against libm's double
// results, over sweeps of f32 bit patterns, and their special values, in
// each vector variant this CPU runs (baseline, and AVX2 where it has it).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "lockstep/runtime/cpu/vec_math.h"
#include "lockstep/runtime/cpu/vector_isa.h"
#include "support/vector_isa_variants.h"

using namespace lockstep::runtime::cpu;

// The AVX2 checks call only always-inlined vector functions (simd.h).
LOCKSTEP_LANES_BEGIN

namespace {

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

enum class Fn { erf, exp };

template <class V>
LOCKSTEP_LANES_INLINE void apply(Fn f, const float* in, float* out, size_t n) {
  constexpr size_t L = lanes_of<V>;
  for (size_t i = 0; i < n; i += L) {
    float x[L] = {}, y[L];
    for (size_t u = 0; u < L && i + u < n; ++u) x[u] = in[i + u];
    store_n(y, f == Fn::erf ? erf_lanes(load_n<V>(x)) : exp_lanes(load_n<V>(x)));
    for (size_t u = 0; u < L && i + u < n; ++u) out[i + u] = y[u];
  }
}

void apply_baseline(Fn f, const float* in, float* out, size_t n) {
  apply<vec_t<float>>(f, in, out, n);
}

#if LOCKSTEP_HAVE_AVX2_KERNELS
LOCKSTEP_TARGET_AVX2 void apply_avx2(Fn f, const float* in, float* out, size_t n) {
  apply<vec_n<float, 32>>(f, in, out, n);
}
#endif

// f applied to each of xs through the lanes of `isa`'s vectors.
std::vector<float> through_lanes(Fn f, VectorIsa isa, const std::vector<float>& xs) {
  std::vector<float> out(xs.size());
#if LOCKSTEP_HAVE_AVX2_KERNELS
  if (isa == VectorIsa::avx2) {
    apply_avx2(f, xs.data(), out.data(), xs.size());
    return out;
  }
#endif
  apply_baseline(f, xs.data(), out.data(), xs.size());
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
  for (const VectorIsa isa : lockstep::testing::vector_isa_variants()) {
    INFO(to_string(isa));
    const std::vector<float> got = through_lanes(Fn::erf, isa, xs);
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
}

TEST_CASE("erf_lanes at its special values", "[runtime][cpu][vec_math]") {
  const float inf = std::numeric_limits<float>::infinity();
  for (const VectorIsa isa : lockstep::testing::vector_isa_variants()) {
    INFO(to_string(isa));
    const auto got = through_lanes(Fn::erf, isa, {0.0f, -0.0f, inf, -inf, std::nanf(""), 1e-40f,
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
}

TEST_CASE("exp_lanes is within 1 ulp of exp on [-87, 0] (1.02 in AVX2), 0 below, NaN through",
          "[runtime][cpu][vec_math]") {
  std::vector<float> xs;
  for (uint32_t b = 0x80000000u; b <= to_bits(-87.0f); b += 173) xs.push_back(from_bits(b));
  const float inf = std::numeric_limits<float>::infinity();
  for (const VectorIsa isa : lockstep::testing::vector_isa_variants()) {
    INFO(to_string(isa));
    const std::vector<float> got = through_lanes(Fn::exp, isa, xs);
    double worst = 0;
    for (size_t i = 0; i < xs.size(); ++i)
      worst = std::max(worst, ulps(got[i], std::exp(static_cast<double>(xs[i]))));
    CHECK(worst <= (isa == VectorIsa::avx2 ? 1.02 : 1.0));  // exhaustive searches' bounds
    const auto special =
        through_lanes(Fn::exp, isa, {-87.5f, -1e30f, -inf, std::nanf(""), 0.0f, -0.0f});
    CHECK(special[0] == 0.0f);
    CHECK(special[1] == 0.0f);
    CHECK(special[2] == 0.0f);
    CHECK(std::isnan(special[3]));
    CHECK(special[4] == 1.0f);
    CHECK(special[5] == 1.0f);
  }
}

TEST_CASE("exp_shifted: each exp within 1.02 ulp, the sum, tails, -inf to 0, in place or sum only",
          "[runtime][cpu][vec_math]") {
  const float inf = std::numeric_limits<float>::infinity();
  for (const VectorIsa isa : lockstep::testing::vector_isa_variants()) {
    const lockstep::testing::ScopedVectorIsa use(isa);
    for (int64_t n = 1; n <= 19; ++n) {  // tails and bodies of 4 and 8 lanes
      INFO(to_string(isa) << ", n = " << n);
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
          CHECK(ulps(out[i], want) <= 1.02);
      }
      CHECK(sum == Approx(want_sum).epsilon(1e-6));
      CHECK(exp_shifted(in.data(), nullptr, n, shift) == sum);  // the sum alone: the same bits
      std::vector<float> same = in;
      CHECK(exp_shifted(same.data(), same.data(), n, shift) == sum);  // in place
      CHECK(same == out);
    }
  }
}

TEST_CASE("row_max: the largest wherever it sits, -inf when empty, NaN when any is NaN",
          "[runtime][cpu][vec_math]") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(row_max(static_cast<const float*>(nullptr), 0) == -inf);
  for (int64_t n = 1; n <= 19; ++n) {
    for (int64_t at = 0; at < n; ++at) {
      INFO("n = " << n << ", largest at " << at);
      std::vector<float> row(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) row[i] = -3.0f - static_cast<float>(i % 5);
      row[at] = 2.5f;
      CHECK(row_max(row.data(), n) == 2.5f);
      std::vector<double> wide(row.begin(), row.end());
      CHECK(row_max(wide.data(), n) == 2.5);
      row[(at + 1) % n] = std::nanf("");  // beside it, or over it when n is 1
      CHECK(std::isnan(row_max(row.data(), n)));
      wide[static_cast<size_t>((at + 1) % n)] = std::nan("");
      CHECK(std::isnan(row_max(wide.data(), n)));
    }
  }
  const std::vector<float> masked(9, -inf);
  CHECK(row_max(masked.data(), 9) == -inf);
}
