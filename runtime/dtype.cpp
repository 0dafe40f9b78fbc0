#include "lockstep/runtime/dtype.h"

#include <charconv>
#include <cmath>
#include <limits>

namespace lockstep::runtime {

size_t dtype_size(DType d) {
  switch (d) {
    case DType::f32: case DType::i32: return 4;
    case DType::f64: case DType::i64: return 8;
    case DType::bf16: case DType::f16: return 2;
    case DType::u8: case DType::boolean: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType d) {
  switch (d) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::boolean: return "bool";
  }
  return "?";
}

namespace {

// In (lowest - 1, max + 1): for i64, lowest - 1 rounds to lowest and max + 1
// is 2^63, both exact doubles.
template <class T>
bool fits_integer(double value) {
  const double lo = static_cast<double>(std::numeric_limits<T>::lowest());
  const double hi = static_cast<double>(std::numeric_limits<T>::max()) + 1.0;
  return (value >= lo || value > lo - 1.0) && value < hi;
}

// A finite value past a floating type's largest would become an infinity;
// PyTorch refuses it ("cannot be converted to type at::Half without
// overflow"), and lets NaN and the infinities through.
bool fits_floating(double value, double max) {
  return !std::isfinite(value) || std::fabs(value) <= max;
}

}  // namespace

bool holds_value(DType d, double value) {
  switch (d) {
    case DType::i32: return fits_integer<int32_t>(value);
    case DType::i64: return fits_integer<int64_t>(value);
    case DType::u8: return fits_integer<uint8_t>(value);
    case DType::f32: return fits_floating(value, std::numeric_limits<float>::max());
    case DType::bf16: return fits_floating(value, 3.3895313892515355e38);  // 0x7f7f
    case DType::f16: return fits_floating(value, 65504.0);
    case DType::f64: case DType::boolean: return true;
  }
  return true;
}

bool is_floating(DType d) {
  return d == DType::f32 || d == DType::f64 || d == DType::bf16 || d == DType::f16;
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  auto rank = [](DType d) {
    switch (d) {
      case DType::boolean: return 0;
      case DType::u8: return 1;
      case DType::i32: return 2;
      case DType::i64: return 3;
      case DType::f16: return 4;
      case DType::bf16: return 5;
      case DType::f32: return 6;
      case DType::f64: return 7;
    }
    return 0;
  };
  // f16 with bf16 has no exact common 16-bit type: use f32 as PyTorch does.
  if ((a == DType::f16 && b == DType::bf16) || (a == DType::bf16 && b == DType::f16))
    return DType::f32;
  return rank(a) >= rank(b) ? a : b;
}

Device Device::parse(std::string_view s) {
  if (s == "cpu") return cpu();
  if (s == "cuda") return cuda(0);
  if (s.starts_with("cuda:")) {
    std::string_view num = s.substr(5);
    int index = -1;
    auto [ptr, ec] = std::from_chars(num.data(), num.data() + num.size(), index);
    if (ec == std::errc() && ptr == num.data() + num.size() && index >= 0) return cuda(index);
  }
  throw Error(fmt::format("invalid device '{}': expected cpu, cuda or cuda:N", s));
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", index);
}

}  // namespace lockstep::runtime
