// Tests of CPU kernels with a wide variant (runtime/cpu/vector_isa.h) run
// each variant this CPU has: for (isa : vector_isa_variants()) { ScopedVectorIsa use(isa); ... }
#pragma once

#include <catch2/catch.hpp>

#include <vector>

#include "lockstep/runtime/cpu/vector_isa.h"

namespace lockstep::testing {

// The baseline, and AVX2 where this CPU has it (a warning says when not).
inline std::vector<runtime::cpu::VectorIsa> vector_isa_variants() {
  using runtime::cpu::VectorIsa;
  if (runtime::cpu::supports(VectorIsa::avx2)) return {VectorIsa::baseline, VectorIsa::avx2};
  WARN("this CPU (or build) has no AVX2 kernels: only the baseline variant is checked");
  return {VectorIsa::baseline};
}

// Runs the kernels in `isa` for its scope, then restores the process's choice.
class ScopedVectorIsa {
 public:
  explicit ScopedVectorIsa(runtime::cpu::VectorIsa isa) { runtime::cpu::set_vector_isa(isa); }
  ~ScopedVectorIsa() { runtime::cpu::set_vector_isa(saved_); }
  ScopedVectorIsa(const ScopedVectorIsa&) = delete;
  ScopedVectorIsa& operator=(const ScopedVectorIsa&) = delete;

 private:
  runtime::cpu::VectorIsa saved_ = runtime::cpu::vector_isa();
};

}  // namespace lockstep::testing
