// Which of OpenBLAS's kernel sets this process runs, and a repair of its
// choice on Intel CPUs that OpenBLAS 0.3.21-0.3.24 does not know.
//
// OpenBLAS as Debian and Ubuntu ship it (DYNAMIC_ARCH) picks its kernels when
// it loads, by the CPU's family and model. From 0.3.21 to 0.3.24 (Debian 12
// has 0.3.21) an Intel CPU of a model newer than the release (Emerald Rapids,
// Granite Rapids, Meteor Lake, ...) falls through to the Pentium 4's SSE3
// kernels, "Prescott": f32 gemm then runs 3-6x slower than on the AVX-512
// kernels the CPU has. OpenBLAS 0.3.25 fixed it.
//
// Before main(), when OpenBLAS chose Prescott on a CPU with AVX and nobody
// chose for it (OPENBLAS_CORETYPE unset), lockstep runs OpenBLAS's selection
// again with the kernel set that OpenBLAS's own fallback takes by the CPU's
// features (fallback_core), then leaves the environment as it found it. An
// OPENBLAS_CORETYPE the user sets always wins.
#pragma once

#include <string>

#include "lockstep/runtime/cpu/cpu_features.h"

namespace lockstep::runtime::cpu {

struct BlasCore {
  std::string name;      // OpenBLAS's name for its kernels: "Cooperlake", "Haswell", ...
  std::string detected;  // OpenBLAS's own choice when lockstep replaced it, else empty
};

// The kernels OpenBLAS runs in this process (after the repair).
BlasCore blas_core();

// "OpenBLAS 0.3.21 (Cooperlake kernels; OpenBLAS chose Prescott)", for
// benchmark headers.
std::string blas_description();

// Runs the repair once; later calls do nothing. Called before main() by the
// gemm wrappers' file (ops/linalg.cpp), while the process has one thread.
void repair_blas_core();

// The kernel set OpenBLAS's fallback takes for `features` (its dynamic.c):
// Cooperlake with AVX-512 BF16, SkylakeX with AVX-512, Haswell with AVX2,
// Sandybridge with AVX; empty without AVX (Prescott is then right).
std::string fallback_core(const CpuFeatures& features);

}  // namespace lockstep::runtime::cpu
