#include "lockstep/runtime/cpu/openblas_core.h"

#include <cblas.h>
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include <fmt/format.h>

namespace lockstep::runtime::cpu {
namespace {

BlasCore& core_state() {
  static BlasCore core;
  return core;
}

std::string current_core_name() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "";
}

// OpenBLAS's selection, run again. Only a DYNAMIC_ARCH build has these entry
// points (and a choice to repair); they are not in cblas.h, so looked up.
bool reselect(const std::string& core) {
  using Entry = void (*)();
  auto quit = reinterpret_cast<Entry>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
  auto init = reinterpret_cast<Entry>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
  if (quit == nullptr || init == nullptr) return false;
  // init reads OPENBLAS_CORETYPE; quit only forgets the current choice.
  setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  quit();
  init();
  unsetenv("OPENBLAS_CORETYPE");
  return true;
}

}  // namespace

std::string fallback_core(const CpuFeatures& features) {
  if (features.avx512_bf16) return "Cooperlake";
  if (features.avx512) return "SkylakeX";
  if (features.avx2) return "Haswell";
  if (features.avx) return "Sandybridge";
  return "";
}

void repair_blas_core() {
  static std::once_flag once;
  std::call_once(once, [] {
    BlasCore& core = core_state();
    core.name = current_core_name();
    if (core.name != "Prescott" || std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
    const std::string better = fallback_core(cpu_features());
    if (better.empty() || !reselect(better)) return;
    core.detected = core.name;
    core.name = current_core_name();
  });
}

BlasCore blas_core() {
  repair_blas_core();
  return core_state();
}

std::string blas_description() {
  const BlasCore core = blas_core();
  // openblas_get_config(): "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Cooperlake MAX_THREADS=64".
  std::string config = openblas_get_config();
  std::string version = config.substr(0, config.find(' ', config.find(' ') + 1));
  if (core.detected.empty()) return fmt::format("{} ({} kernels)", version, core.name);
  return fmt::format("{} ({} kernels; OpenBLAS chose {})", version, core.name, core.detected);
}

}  // namespace lockstep::runtime::cpu
