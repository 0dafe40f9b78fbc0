// bf16 and f16 conversions: known bit patterns, round to nearest even,
// subnormals, infinities, NaN and overflow; exhaustive round trips; and a
// comparison with a brute-force nearest-value reference over many floats.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "lockstep/runtime/half.h"
#include "lockstep/runtime/random.h"

using namespace lockstep::runtime;

namespace {

float from_bits(uint32_t u) { return bits_float(u); }

// The value of a finite f16 bit pattern, computed from the format's
// definition (not through f16's own conversion).
double f16_value(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

// Round-to-nearest-even f16 of f, by searching the table of every positive
// finite f16 value. Finite, non-NaN f only.
uint16_t f16_reference(float f) {
  static const std::vector<double> table = [] {
    std::vector<double> t;
    for (uint32_t h = 0; h <= 0x7bff; ++h) t.push_back(f16_value(static_cast<uint16_t>(h)));
    return t;
  }();
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::abs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00;  // halfway to 2^16 and above: infinity
  // First entry > a; the candidates are the one before it and it.
  auto it = std::upper_bound(table.begin(), table.end(), a);
  auto hi = static_cast<uint16_t>(it - table.begin());
  auto lo = static_cast<uint16_t>(hi - 1);
  if (hi > 0x7bff) return sign | 0x7bff;
  const double dlo = a - table[lo], dhi = table[hi] - a;
  uint16_t pick = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1) ? hi : lo);
  return sign | pick;
}

// Round-to-nearest-even bf16 of f (finite, non-NaN), from the exact values of
// the two neighbouring bf16 patterns.
uint16_t bf16_reference(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);  // truncation: |lo| <= |f|
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  auto value = [](uint16_t b) {  // |value|; the pattern after the largest finite is 2^128
    if ((b & 0x7fff) == 0x7f80) return std::ldexp(1.0, 128);
    return std::abs(static_cast<double>(from_bits(static_cast<uint32_t>(b) << 16)));
  };
  const double a = std::abs(static_cast<double>(f));
  const double dlo = a - value(lo), dhi = value(hi) - a;
  return dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1) ? hi : lo);
}

}  // namespace

TEST_CASE("f16: exact values have their known bit patterns", "[runtime][half][f16]") {
  struct Row {
    float value;
    uint16_t bits;
  };
  const Row row = GENERATE(Row{1.0f, 0x3c00}, Row{-1.0f, 0xbc00}, Row{0.0f, 0x0000},
                           Row{-0.0f, 0x8000}, Row{0.5f, 0x3800}, Row{2.0f, 0x4000},
                           Row{-2.0f, 0xc000}, Row{0.333251953125f, 0x3555},
                           Row{65504.0f, 0x7bff},           // largest finite
                           Row{-65504.0f, 0xfbff},
                           Row{6.103515625e-05f, 0x0400},   // 2^-14, smallest normal
                           Row{5.9604644775390625e-08f, 0x0001},  // 2^-24, smallest subnormal
                           Row{6.097555160522461e-05f, 0x03ff},   // largest subnormal
                           Row{1024.0f, 0x6400}, Row{1.0009765625f, 0x3c01});
  INFO(row.value);
  CHECK(f16(row.value).bits == row.bits);
  f16 h;
  h.bits = row.bits;
  CHECK(static_cast<float>(h) == row.value);
  CHECK(std::signbit(static_cast<float>(h)) == std::signbit(row.value));
}

TEST_CASE("f16: round to nearest, ties to even", "[runtime][half][f16]") {
  // 1 + 2^-11 lies halfway between 1 (mantissa 0, even) and 1 + 2^-10 (odd).
  CHECK(f16(1.0f + 0x1.0p-11f).bits == 0x3c00);
  // 1 + 3*2^-11 lies halfway between mantissa 1 (odd) and 2 (even).
  CHECK(f16(1.0f + 3 * 0x1.0p-11f).bits == 0x3c02);
  // Just above the halfway point rounds up, just below rounds down.
  CHECK(f16(1.0f + 0x1.0p-11f + 0x1.0p-20f).bits == 0x3c01);
  CHECK(f16(1.0f + 0x1.0p-11f - 0x1.0p-20f).bits == 0x3c00);
  // Rounding up can carry into the exponent: 2 - 2^-12 -> 2.
  CHECK(f16(2.0f - 0x1.0p-12f).bits == 0x4000);
  // Negative values round the magnitude the same way.
  CHECK(f16(-(1.0f + 3 * 0x1.0p-11f)).bits == 0xbc02);
  CHECK(f16(0.1f).bits == 0x2e66);
  CHECK(f16(3.14159265f).bits == 0x4248);
}

TEST_CASE("f16: subnormals round to multiples of 2^-24", "[runtime][half][f16]") {
  // 1e-7 / 2^-24 = 1.68 -> 2.
  CHECK(f16(1e-7f).bits == 0x0002);
  CHECK(f16(-1e-7f).bits == 0x8002);
  // Exactly half the smallest subnormal ties to even (zero); 1.5 ulps to 2.
  CHECK(f16(0x1.0p-25f).bits == 0x0000);
  CHECK(f16(3 * 0x1.0p-25f).bits == 0x0002);
  CHECK(f16(0x1.0p-25f + 0x1.0p-40f).bits == 0x0001);
  // Far below: zero, with the sign kept.
  CHECK(f16(1e-10f).bits == 0x0000);
  CHECK(f16(-1e-10f).bits == 0x8000);
  // 1023.5 ulps ties to 1024 (even): the smallest normal.
  CHECK(f16(0x1.0p-14f - 0x1.0p-25f).bits == 0x0400);
  CHECK(f16(0x1.0p-14f - 0x1.0p-24f).bits == 0x03ff);
  // And back: subnormal patterns are mant * 2^-24.
  f16 h;
  h.bits = 0x0155;
  CHECK(static_cast<float>(h) == 0x155 * 0x1.0p-24f);
}

TEST_CASE("f16: infinities, NaN and overflow", "[runtime][half][f16]") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(f16(inf).bits == 0x7c00);
  CHECK(f16(-inf).bits == 0xfc00);
  // 65520 is halfway between 65504 and 2^16 (not representable): to infinity.
  CHECK(f16(65519.996f).bits == 0x7bff);
  CHECK(f16(65520.0f).bits == 0x7c00);
  CHECK(f16(1e6f).bits == 0x7c00);
  CHECK(f16(-1e6f).bits == 0xfc00);
  CHECK(f16(std::numeric_limits<float>::max()).bits == 0x7c00);

  const f16 nan(std::numeric_limits<float>::quiet_NaN());
  CHECK((nan.bits & 0x7c00) == 0x7c00);
  CHECK((nan.bits & 0x03ff) != 0);
  CHECK(std::isnan(static_cast<float>(nan)));
  CHECK(std::isnan(static_cast<float>(f16(from_bits(0x7f800001)))));  // signalling NaN
  CHECK(std::isnan(static_cast<float>(f16(from_bits(0xffc00000)))));

  f16 h;
  h.bits = 0x7c00;
  CHECK(static_cast<float>(h) == inf);
  h.bits = 0xfc00;
  CHECK(static_cast<float>(h) == -inf);
}

TEST_CASE("f16: every pattern survives a round trip through float", "[runtime][half][f16]") {
  int mismatches = 0, nans = 0;
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    f16 h;
    h.bits = static_cast<uint16_t>(b);
    const float f = h;
    const bool is_nan = (b & 0x7c00) == 0x7c00 && (b & 0x3ff) != 0;
    if (is_nan) {
      nans += std::isnan(f) && std::isnan(static_cast<float>(f16(f))) ? 0 : 1;
      continue;
    }
    if (f16(f).bits != h.bits) ++mismatches;
    // The float value is the one the format defines.
    if ((b & 0x7c00) != 0x7c00 && static_cast<double>(f) != f16_value(h.bits)) ++mismatches;
  }
  CHECK(mismatches == 0);
  CHECK(nans == 0);
}

TEST_CASE("f16: matches a nearest-value reference on random floats", "[runtime][half][f16]") {
  Generator g(7);
  int checked = 0, mismatches = 0;
  uint32_t first_bad = 0;
  for (int i = 0; i < 200000; ++i) {
    // Exponents around f16's range (2^-27 .. 2^17), random mantissa and sign.
    uint32_t r = g.next_u32();
    uint32_t exp = 100 + (g.next_u32() % 45);
    uint32_t u = (r & 0x807fffffu) | (exp << 23);
    float f = from_bits(u);
    ++checked;
    if (f16(f).bits != f16_reference(f)) {
      if (mismatches++ == 0) first_bad = u;
    }
  }
  INFO("first mismatch at float bits 0x" << std::hex << first_bad);
  CHECK(checked == 200000);
  CHECK(mismatches == 0);
}

TEST_CASE("bf16: exact values have their known bit patterns", "[runtime][half][bf16]") {
  CHECK(bf16(1.0f).bits == 0x3f80);
  CHECK(bf16(-1.0f).bits == 0xbf80);
  CHECK(bf16(0.0f).bits == 0x0000);
  CHECK(bf16(-0.0f).bits == 0x8000);
  CHECK(bf16(2.0f).bits == 0x4000);
  CHECK(bf16(3.0f).bits == 0x4040);
  CHECK(bf16(0.5f).bits == 0x3f00);
  CHECK(bf16(65536.0f).bits == 0x4780);
  CHECK(bf16(from_bits(0x7f7f0000)).bits == 0x7f7f);  // largest finite
  bf16 b;
  b.bits = 0x3fc0;
  CHECK(static_cast<float>(b) == 1.5f);
  b.bits = 0xc2f7;
  CHECK(static_cast<float>(b) == -123.5f);
}

TEST_CASE("bf16: round to nearest, ties to even", "[runtime][half][bf16]") {
  CHECK(bf16(from_bits(0x3f808000)).bits == 0x3f80);  // tie, lower is even
  CHECK(bf16(from_bits(0x3f818000)).bits == 0x3f82);  // tie, upper is even
  CHECK(bf16(from_bits(0x3f808001)).bits == 0x3f81);  // above the tie
  CHECK(bf16(from_bits(0x3f807fff)).bits == 0x3f80);  // below the tie
  CHECK(bf16(from_bits(0x3fffffff)).bits == 0x4000);  // carries into the exponent
  CHECK(bf16(from_bits(0xbf818000)).bits == 0xbf82);  // negative tie
  CHECK(bf16(0.1f).bits == 0x3dcd);
  CHECK(bf16(3.14159265f).bits == 0x4049);
  // Float subnormals round the same way.
  CHECK(bf16(from_bits(0x00000001)).bits == 0x0000);
  CHECK(bf16(from_bits(0x00008000)).bits == 0x0000);
  CHECK(bf16(from_bits(0x00018000)).bits == 0x0002);
}

TEST_CASE("bf16: infinities, NaN and overflow", "[runtime][half][bf16]") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(bf16(inf).bits == 0x7f80);
  CHECK(bf16(-inf).bits == 0xff80);
  // Above the halfway point between the largest finite bf16 and 2^128.
  CHECK(bf16(std::numeric_limits<float>::max()).bits == 0x7f80);
  CHECK(bf16(-std::numeric_limits<float>::max()).bits == 0xff80);
  CHECK(bf16(from_bits(0x7f7f7fff)).bits == 0x7f7f);
  // NaN stays NaN, including a signalling NaN whose payload is in the low
  // bits only (plain truncation would turn it into infinity).
  CHECK(std::isnan(static_cast<float>(bf16(std::numeric_limits<float>::quiet_NaN()))));
  const bf16 snan(from_bits(0x7f800001));
  CHECK(std::isnan(static_cast<float>(snan)));
  CHECK((snan.bits & 0x7f80) == 0x7f80);
  CHECK((snan.bits & 0x007f) != 0);
  CHECK(std::isnan(static_cast<float>(bf16(from_bits(0xff800001)))));
}

TEST_CASE("bf16: every pattern survives a round trip through float", "[runtime][half][bf16]") {
  int mismatches = 0;
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    bf16 h;
    h.bits = static_cast<uint16_t>(b);
    const float f = h;
    if (float_bits(f) != b << 16) ++mismatches;  // bf16 -> float is exact: the top half
    if (std::isnan(f)) {
      mismatches += std::isnan(static_cast<float>(bf16(f))) ? 0 : 1;
      continue;
    }
    if (bf16(f).bits != h.bits) ++mismatches;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("bf16: matches a nearest-value reference on random floats", "[runtime][half][bf16]") {
  Generator g(11);
  int mismatches = 0;
  uint32_t first_bad = 0;
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = g.next_u32();
    if ((u & 0x7f800000u) == 0x7f800000u) continue;  // inf and NaN are tested above
    if (bf16(from_bits(u)).bits != bf16_reference(from_bits(u))) {
      if (mismatches++ == 0) first_bad = u;
    }
  }
  INFO("first mismatch at float bits 0x" << std::hex << first_bad);
  CHECK(mismatches == 0);
}
