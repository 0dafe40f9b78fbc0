#include "lockstep/runtime/cpu/vector_isa.h"

#include <atomic>

#include "lockstep/runtime/cpu/cpu_features.h"
#include "lockstep/runtime/error.h"

namespace lockstep::runtime::cpu {
namespace {

constexpr int kUnset = -1;
std::atomic<int> chosen{kUnset};

VectorIsa initial_choice() {
  if (const auto isa = read_vector_isa()) {
    LOCKSTEP_CHECK(supports(*isa),
                   "LOCKSTEP_CPU_ISA={}: this CPU (or this build) has no {} kernels; unset it, or "
                   "set it to baseline",
                   to_string(*isa), to_string(*isa));
    return *isa;
  }
  return supports(VectorIsa::avx2) ? VectorIsa::avx2 : VectorIsa::baseline;
}

}  // namespace

const char* to_string(VectorIsa isa) { return isa == VectorIsa::avx2 ? "avx2" : "baseline"; }

bool supports(VectorIsa isa) {
  if (isa == VectorIsa::baseline) return true;
  static const bool avx2 = LOCKSTEP_HAVE_AVX2_KERNELS && cpu_features().avx2;
  return avx2;
}

VectorIsa vector_isa() {
  int v = chosen.load(std::memory_order_relaxed);
  if (v == kUnset) {
    // Racing first calls compute the same value.
    v = static_cast<int>(initial_choice());
    chosen.store(v, std::memory_order_relaxed);
  }
  return static_cast<VectorIsa>(v);
}

void set_vector_isa(VectorIsa isa) {
  LOCKSTEP_CHECK(supports(isa), "set_vector_isa({}): this CPU (or this build) has no {} kernels",
                 to_string(isa), to_string(isa));
  chosen.store(static_cast<int>(isa), std::memory_order_relaxed);
}

std::optional<VectorIsa> read_vector_isa(const EnvLookup& env) {
  const auto value = env("LOCKSTEP_CPU_ISA");
  if (!value) return std::nullopt;
  if (*value == "baseline") return VectorIsa::baseline;
  if (*value == "avx2") return VectorIsa::avx2;
  throw Error(fmt::format("LOCKSTEP_CPU_ISA={}: expected baseline or avx2 (or leave it unset for "
                          "the widest this CPU has)",
                          quoted_value(*value)));
}

}  // namespace lockstep::runtime::cpu
