#include "lockstep/runtime/cuda/ops/math_mode.h"

#include <atomic>

namespace lockstep::runtime::cuda {

namespace {
std::atomic<bool> g_allow_tf32{false};
}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

}  // namespace lockstep::runtime::cuda
