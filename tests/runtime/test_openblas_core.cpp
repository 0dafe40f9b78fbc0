// runtime/cpu/openblas_core: OpenBLAS runs kernels the CPU has (not the
// Pentium 4's that OpenBLAS 0.3.21-0.3.24 falls back to on Intel CPUs newer
// than itself), the fallback's choice by features, and a user's
// OPENBLAS_CORETYPE kept, the environment left as found.
#include <catch2/catch.hpp>
#include <dlfcn.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "lockstep/runtime/cpu/openblas_core.h"
#include "support/skip.h"
#include "support/subprocess.h"

using namespace lockstep::runtime::cpu;
namespace lt = lockstep::testing;

namespace {

// Why OpenBLAS has no choice of kernels to check here, or "".
std::string why_no_choice() {
  if (dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init") == nullptr)
    return "this OpenBLAS was built for one CPU (no DYNAMIC_ARCH): its kernels are fixed";
  return "";
}

// This test binary's probe, run as a child with `env`: its output.
std::string probe(const std::vector<std::string>& env_argv) {
  std::vector<std::string> argv = env_argv;
  argv.push_back(lt::bin_path("lockstep_tests"));
  argv.push_back("[openblas-core-probe]");
  const lt::ProcessResult r = lt::run_process(argv, std::chrono::seconds(60));
  INFO(r.output);
  REQUIRE(r.ok());
  return r.output;
}

}  // namespace

TEST_CASE("openblas core: OpenBLAS's fallback by CPU features", "[openblas_core]") {
  CHECK(fallback_core({}) == "");
  CHECK(fallback_core({.avx = true}) == "Sandybridge");
  CHECK(fallback_core({.avx = true, .avx2 = true}) == "Haswell");
  CHECK(fallback_core({.avx = true, .avx2 = true, .avx512 = true}) == "SkylakeX");
  CHECK(fallback_core({.avx = true, .avx2 = true, .avx512 = true, .avx512_bf16 = true}) ==
        "Cooperlake");
}

TEST_CASE("openblas core: OpenBLAS runs kernels this CPU has, not the Pentium 4's",
          "[openblas_core]") {
  LOCKSTEP_SKIP_IF(why_no_choice());
  LOCKSTEP_SKIP_IF(std::getenv("OPENBLAS_CORETYPE") != nullptr
                       ? "OPENBLAS_CORETYPE is set: OpenBLAS runs the kernels it names"
                       : "");
  const BlasCore core = blas_core();
  INFO("OpenBLAS runs " << core.name << " (it chose " << core.detected << "); "
                        << blas_description());
  if (cpu_features().avx) CHECK(core.name != "Prescott");
  if (!core.detected.empty()) {
    CHECK(core.detected == "Prescott");
    CHECK(core.name == fallback_core(cpu_features()));
  }
  CHECK(std::getenv("OPENBLAS_CORETYPE") == nullptr);  // the environment as it was
}

TEST_CASE("openblas core: a user's OPENBLAS_CORETYPE wins and stays set", "[openblas_core]") {
  LOCKSTEP_SKIP_IF(why_no_choice());
  const std::string forced = probe({"/usr/bin/env", "OPENBLAS_CORETYPE=Nehalem"});
  CHECK_THAT(forced, Catch::Contains("core Nehalem, replaced none, OPENBLAS_CORETYPE=Nehalem"));
  const std::string own = probe({"/usr/bin/env", "-u", "OPENBLAS_CORETYPE"});
  // This process's choice where no OPENBLAS_CORETYPE chose for it (the tests
  // may run with one set).
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr)
    CHECK_THAT(own, Catch::Contains("core " + blas_core().name + ","));
  if (cpu_features().avx) CHECK_THAT(own, !Catch::Contains("core Prescott,"));
  CHECK_THAT(own, Catch::Contains("OPENBLAS_CORETYPE=(unset)"));
}

// Run by the case above in a child process, where OpenBLAS chooses afresh.
TEST_CASE("openblas core: print this process's kernels", "[.][openblas-core-probe]") {
  const BlasCore core = blas_core();
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  std::cout << "core " << core.name << ", replaced "
            << (core.detected.empty() ? "none" : core.detected)
            << ", OPENBLAS_CORETYPE=" << (env != nullptr ? env : "(unset)") << std::endl;
}
