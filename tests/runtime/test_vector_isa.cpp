// runtime/cpu/vector_isa: which variant the CPU kernels run, LOCKSTEP_CPU_ISA,
// and switching.
#include <catch2/catch.hpp>

#include "lockstep/runtime/cpu/cpu_features.h"
#include "lockstep/runtime/cpu/vector_isa.h"
#include "lockstep/runtime/error.h"
#include "support/env_lookup.h"
#include "support/vector_isa_variants.h"

using namespace lockstep::runtime::cpu;
using lockstep::testing::env_lookup;
using Catch::Contains;

TEST_CASE("LOCKSTEP_CPU_ISA names a variant; anything else is refused, naming it",
          "[runtime][cpu]") {
  CHECK_FALSE(read_vector_isa(env_lookup({})));
  CHECK(read_vector_isa(env_lookup({{"LOCKSTEP_CPU_ISA", "baseline"}})) == VectorIsa::baseline);
  CHECK(read_vector_isa(env_lookup({{"LOCKSTEP_CPU_ISA", "avx2"}})) == VectorIsa::avx2);
  CHECK_THROWS_WITH(read_vector_isa(env_lookup({{"LOCKSTEP_CPU_ISA", "avx512"}})),
                    Contains("LOCKSTEP_CPU_ISA='avx512': expected baseline or avx2"));
  // A job script with Windows line endings: the \r shown, not sent to the terminal.
  try {
    read_vector_isa(env_lookup({{"LOCKSTEP_CPU_ISA", "baseline\r"}}));
    FAIL("a value with a carriage return was taken");
  } catch (const lockstep::Error& e) {
    const std::string what = e.what();
    CHECK(what.find('\r') == std::string::npos);
    CHECK_THAT(what, Contains("LOCKSTEP_CPU_ISA='baseline\\r'") && Contains("carriage return"));
  }
}

TEST_CASE("The widest variant the CPU has is chosen; one it lacks cannot be set",
          "[runtime][cpu]") {
  CHECK(supports(VectorIsa::baseline));
#if defined(__x86_64__)
  CHECK(supports(VectorIsa::avx2) == cpu_features().avx2);
#else
  CHECK_FALSE(supports(VectorIsa::avx2));
#endif
  const lockstep::testing::ScopedVectorIsa restore(vector_isa());
  if (supports(VectorIsa::avx2)) {
    set_vector_isa(VectorIsa::baseline);
    CHECK(vector_isa() == VectorIsa::baseline);
    set_vector_isa(VectorIsa::avx2);
    CHECK(vector_isa() == VectorIsa::avx2);
  } else {
    CHECK_THROWS_WITH(set_vector_isa(VectorIsa::avx2), Contains("has no avx2 kernels"));
    CHECK(vector_isa() == VectorIsa::baseline);
  }
}
