// Internal: element conversion between the C++ types of the dtypes.
#pragma once

#include <type_traits>

#include "lockstep/runtime/half.h"

namespace lockstep::runtime::detail {

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

template <class U, class T>
inline U convert(T v) {
  if constexpr (std::is_same_v<U, T>) {
    return v;
  } else if constexpr (std::is_same_v<U, bool>) {
    // Compared in the source type: a tiny f64 is not zero just because f32 would round it to 0.
    if constexpr (is_half_v<T>) return static_cast<float>(v) != 0.0f;
    else return v != T(0);
  } else if constexpr (is_half_v<U> || is_half_v<T>) {
    return static_cast<U>(static_cast<float>(v));
  } else {
    return static_cast<U>(v);
  }
}

}  // namespace lockstep::runtime::detail
