// bf16 and f16 storage types: 16-bit patterns with float conversion.
// Arithmetic happens in float; these only store.
#pragma once

#include <cstdint>
#include <cstring>

namespace lockstep::runtime {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// bfloat16: the top 16 bits of an IEEE float, rounded to nearest even.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  bf16(float f) {  // NOLINT(google-explicit-constructor): mirrors float
    uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it quiet
      bits = static_cast<uint16_t>((u >> 16) | 0x40u);
      return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    bits = static_cast<uint16_t>(u >> 16);
  }
  operator float() const { return bits_float(static_cast<uint32_t>(bits) << 16); }
};

// IEEE binary16, round to nearest even, with subnormals and infinities.
struct f16 {
  uint16_t bits = 0;
  f16() = default;
  f16(float f) {  // NOLINT(google-explicit-constructor)
    uint32_t u = float_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) {  // NaN
      bits = static_cast<uint16_t>(sign | 0x7e00u);
    } else if (abs >= 0x477ff000u) {  // rounds to >= 65520: infinity
      bits = static_cast<uint16_t>(sign | 0x7c00u);
    } else if (abs < 0x38800000u) {  // below the smallest normal: subnormal
      // Adding 0.5 lets the FPU do the rounding of the shifted mantissa.
      float r = bits_float(abs) + 0.5f;
      bits = static_cast<uint16_t>(sign | (float_bits(r) - 0x3f000000u));
    } else {
      uint32_t mant_odd = (abs >> 13) & 1u;
      abs += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
      bits = static_cast<uint16_t>(sign | (abs >> 13));
    }
  }
  operator float() const {
    uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
    uint32_t exp = (bits >> 10) & 0x1fu;
    uint32_t mant = bits & 0x3ffu;
    if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {  // zero or subnormal: mant * 2^-24
      float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
      return sign ? -v : v;
    }
    return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  }
};

// The type a kernel computes in for storage type T: float for bf16 and f16.
template <class T> struct compute_type { using type = T; };
template <> struct compute_type<bf16> { using type = float; };
template <> struct compute_type<f16> { using type = float; };
template <class T> using compute_t = typename compute_type<T>::type;

}  // namespace lockstep::runtime
