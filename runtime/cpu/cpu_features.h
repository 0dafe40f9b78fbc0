// What this CPU's vector units can do, as the OS lets programs use them:
// which OpenBLAS kernels to repair to (openblas_core.h) and which of lockstep's
// own kernels to run (vector_isa.h).
#pragma once

namespace lockstep::runtime::cpu {

struct CpuFeatures {
  bool avx = false;
  bool avx2 = false;  // with FMA, as every AVX2 CPU has it
  bool avx512 = false;  // F, BW, DQ and VL (Skylake-SP's set)
  bool avx512_bf16 = false;
};

// All false on other architectures and compilers.
CpuFeatures cpu_features();

}  // namespace lockstep::runtime::cpu
