#include "lockstep/runtime/cpu/vec_math.h"

#include "lockstep/runtime/cpu/vector_isa.h"

// GCC checks the vector ABI at the end of the file: the AVX2 kernel below
// calls only always-inlined vector functions (simd.h).
LOCKSTEP_LANES_BEGIN

namespace lockstep::runtime::cpu {
namespace {

float exp_shifted_baseline(const float* in, float* out, int64_t n, float shift) {
  return exp_shifted_lanes<vec_t<float>>(in, out, n, shift);
}

#if LOCKSTEP_HAVE_AVX2_KERNELS
LOCKSTEP_TARGET_AVX2 float exp_shifted_avx2(const float* in, float* out, int64_t n, float shift) {
  return exp_shifted_lanes<vec_n<float, 32>>(in, out, n, shift);
}
#endif

}  // namespace

float exp_shifted(const float* in, float* out, int64_t n, float shift) {
#if LOCKSTEP_HAVE_AVX2_KERNELS
  if (vector_isa() == VectorIsa::avx2) return exp_shifted_avx2(in, out, n, shift);
#endif
  return exp_shifted_baseline(in, out, n, shift);
}

}  // namespace lockstep::runtime::cpu
