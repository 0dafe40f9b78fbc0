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

#include <cstring>

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
