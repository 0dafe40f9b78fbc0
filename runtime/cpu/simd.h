// Short SIMD vectors for the CPU reduction loops, via the GCC/Clang vector
// extension (16 bytes: SSE2, available on every x86-64; other targets get
// the same code lowered to what they have).
//
// Why not leave it to the auto-vectoriser: a float reduction may only be
// vectorised if the compiler may reorder the additions (-ffast-math), and
// the manual "8 scalar lanes" idiom is vectorised well at -O2 but turned into
// shuffle-heavy code at -O3 (measured: 4x slower). Explicit vectors give the
// same fast loop at every optimisation level.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

namespace lockstep::runtime::cpu {

template <class T> struct Simd;
template <> struct Simd<float> {
  typedef float type __attribute__((vector_size(16)));
};
template <> struct Simd<double> {
  typedef double type __attribute__((vector_size(16)));
};

template <class T> using vec_t = typename Simd<T>::type;
template <class T> inline constexpr int kLanes = static_cast<int>(16 / sizeof(T));

// Functions on vectors of any width are always inlined: a kernel compiled for
// AVX2 (vector_isa.h) must not call a copy compiled for the baseline, which
// passes 32-byte vectors differently. That is also why GCC's warning about
// that difference (-Wpsabi) is off where they are defined: no such call is
// ever made.
#define LOCKSTEP_LANES_INLINE [[gnu::always_inline]] inline
#if defined(__GNUC__) && !defined(__clang__)
#define LOCKSTEP_LANES_BEGIN _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wpsabi\"")
#define LOCKSTEP_LANES_END _Pragma("GCC diagnostic pop")
#else
#define LOCKSTEP_LANES_BEGIN
#define LOCKSTEP_LANES_END
#endif

// Vectors of any width, for kernels written once for several (vec_math.h):
// vec_n<float, 32> is AVX2's 8 lanes. lanes_of<V> counts a vector's lanes,
// int_lanes_t<V> is the i32 vector a comparison of two V gives.
template <class T, int Bytes> struct SimdN {
  typedef T type __attribute__((vector_size(Bytes)));
};
template <class T, int Bytes> using vec_n = typename SimdN<T, Bytes>::type;
template <class V> using lane_t = std::remove_cvref_t<decltype(std::declval<V>()[0])>;
template <class V> inline constexpr int lanes_of = static_cast<int>(sizeof(V) / sizeof(lane_t<V>));
template <class V> struct IntLanes {
  typedef int32_t type __attribute__((vector_size(sizeof(V))));
};
template <class V> using int_lanes_t = typename IntLanes<V>::type;

template <class T>
inline vec_t<T> load(const T* p) {  // unaligned
  vec_t<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class T>
inline void store(T* p, vec_t<T> v) {  // unaligned
  std::memcpy(p, &v, sizeof v);
}

LOCKSTEP_LANES_BEGIN
template <class V>
LOCKSTEP_LANES_INLINE V load_n(const lane_t<V>* p) {  // unaligned
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class V>
LOCKSTEP_LANES_INLINE void store_n(lane_t<V>* p, V v) {  // unaligned
  std::memcpy(p, &v, sizeof v);
}

template <class V>
LOCKSTEP_LANES_INLINE V splat_n(lane_t<V> x) {
  V v = {};
  return v + x;
}
LOCKSTEP_LANES_END

template <class T>
inline vec_t<T> splat(T x) {
  vec_t<T> v = {};
  return v + x;
}

// Sum of the lanes, in double.
template <class T>
inline double lane_sum(vec_t<T> v) {
  double s = 0;
  for (int u = 0; u < kLanes<T>; ++u) s += v[u];
  return s;
}

}  // namespace lockstep::runtime::cpu
