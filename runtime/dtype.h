// Element types, devices, and the dispatch from a runtime DType to a C++ type.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "lockstep/runtime/error.h"
#include "lockstep/runtime/half.h"

namespace lockstep::runtime {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64, u8, boolean };

size_t dtype_size(DType d);
std::string_view dtype_name(DType d);  // "f32", "f64", "bf16", ... "bool"
bool is_floating(DType d);             // f32, f64, bf16, f16
// Whether `d` holds `value`: an integer dtype (truncating toward zero) not
// NaN, an infinity or a value past its range; a floating one every value but
// a finite one past its largest (70000 in f16); bool every value.
bool holds_value(DType d, double value);
// bf16, f16: on the CPU storage types that compute in f32 (half.h).
inline bool is_reduced_float(DType d) { return d == DType::bf16 || d == DType::f16; }

// C++ type <-> DType. bool is stored as one byte.
template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::u8; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::boolean; };
template <class T> inline constexpr DType dtype_v = dtype_of<T>::value;

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // CUDA ordinal; 0 for CPU

  static Device cpu() { return {}; }
  static Device cuda(int index) { return {DeviceType::CUDA, index}; }
  static Device parse(std::string_view s);  // "cpu", "cuda", "cuda:1"
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;
  bool operator==(const Device&) const = default;
};

// Calls fn(T{}) with T the C++ type of `d`, for every dtype.
template <class Fn>
decltype(auto) dispatch_all(DType d, Fn&& fn) {
  switch (d) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    case DType::bf16: return fn(bf16{});
    case DType::f16: return fn(f16{});
    case DType::i32: return fn(int32_t{});
    case DType::i64: return fn(int64_t{});
    case DType::u8: return fn(uint8_t{});
    case DType::boolean: return fn(bool{});
  }
  throw Error("dispatch: unknown dtype");
}

// Calls fn(T{}) for f32 and f64 (the dtypes with compute kernels); any other
// dtype is an error naming the op.
template <class Fn>
decltype(auto) dispatch_float(DType d, std::string_view op, Fn&& fn) {
  switch (d) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    default:
      throw Error(fmt::format("{}: dtype {} is not supported on CPU; use f32 or f64 "
                              "(convert with .to(DType::f32))",
                              op, dtype_name(d)));
  }
}

// Calls fn(T{}) for every floating dtype (f32, f64, bf16, f16): for kernels
// that load and store T and compute in compute_t<T> (half.h).
template <class Fn>
decltype(auto) dispatch_floating(DType d, std::string_view op, Fn&& fn) {
  switch (d) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    case DType::bf16: return fn(bf16{});
    case DType::f16: return fn(f16{});
    default:
      throw Error(fmt::format("{}: dtype {} is not a floating dtype; convert with "
                              ".to(DType::f32)",
                              op, dtype_name(d)));
  }
}

// Calls fn(T{}) for the dtypes with arithmetic kernels (f32, f64, i32, i64).
template <class Fn>
decltype(auto) dispatch_arith(DType d, std::string_view op, Fn&& fn) {
  switch (d) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    case DType::i32: return fn(int32_t{});
    case DType::i64: return fn(int64_t{});
    default:
      throw Error(fmt::format("{}: no CPU kernel for dtype {}; convert with .to(DType::f32)", op,
                              dtype_name(d)));
  }
}

// Calls fn(T{}) for dispatch_arith's dtypes and bf16, f16 (whose kernels
// compute in compute_t<T>).
template <class Fn>
decltype(auto) dispatch_compute(DType d, std::string_view op, Fn&& fn) {
  if (is_reduced_float(d)) return dispatch_floating(d, op, std::forward<Fn>(fn));
  return dispatch_arith(d, op, std::forward<Fn>(fn));
}

// The dtype both operands of a binary op are converted to: floating beats
// integer, wider beats narrower (f64 > f32 > bf16/f16; i64 > i32 > u8 > bool).
DType promote_types(DType a, DType b);

}  // namespace lockstep::runtime
