// Which vector instructions lockstep's own CPU kernels run with, where a
// kernel has a wide variant (GELU, the exp of softmax rows: vec_math.h).
//
//   baseline: 16-byte vectors (SSE2 on x86-64, which every x86-64 CPU has);
//   avx2:     32-byte vectors and fused multiply-add (AVX2 and FMA), about
//             twice as fast; chosen where the CPU has them.
//
// The two round differently (a fused multiply-add rounds once), so a result
// is the same bit for bit only on machines that ran the same variant.
// LOCKSTEP_CPU_ISA=baseline makes any machine compute what one without AVX2
// does; an exact resume on a machine of the other kind needs it.
#pragma once

#include <optional>

#include "lockstep/runtime/env.h"

// Kernels compiled for AVX2 + FMA beside the baseline ones (x86-64 with GCC
// or Clang); elsewhere only the baseline exists.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LOCKSTEP_HAVE_AVX2_KERNELS 1
#define LOCKSTEP_TARGET_AVX2 __attribute__((target("avx2,fma")))
#else
#define LOCKSTEP_HAVE_AVX2_KERNELS 0
#define LOCKSTEP_TARGET_AVX2
#endif

namespace lockstep::runtime::cpu {

enum class VectorIsa { baseline, avx2 };

const char* to_string(VectorIsa isa);

// Whether this build and this CPU can run `isa`.
bool supports(VectorIsa isa);

// The current choice: LOCKSTEP_CPU_ISA (baseline or avx2) when set, else the
// widest this CPU supports. Throws, naming the variable, when it names
// something else or a variant this CPU lacks.
VectorIsa vector_isa();

// Changes the choice for the whole process (tests run both variants); throws
// when the CPU lacks `isa`.
void set_vector_isa(VectorIsa isa);

// LOCKSTEP_CPU_ISA; nullopt when unset.
std::optional<VectorIsa> read_vector_isa(const EnvLookup& env = process_env());

}  // namespace lockstep::runtime::cpu
