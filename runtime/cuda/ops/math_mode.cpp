#include "lockstep/runtime/cuda/ops/math_mode.h"

#include <atomic>
#include <optional>
#include <string>

#include "lockstep/runtime/env.h"
#include "lockstep/runtime/error.h"

namespace lockstep::runtime::cuda {

namespace {
std::atomic<bool> g_allow_tf32{false};

// LOCKSTEP_CUDNN_BENCHMARK: unset, "" or 0 off, 1 on; anything else an error.
bool benchmark_from_env() {
  const std::optional<std::string> value = process_env()("LOCKSTEP_CUDNN_BENCHMARK");
  if (!value || value->empty() || *value == "0") return false;
  LOCKSTEP_CHECK(*value == "1",
                 "LOCKSTEP_CUDNN_BENCHMARK='{}' is neither 0 nor 1; set it to 1 to time cuDNN's "
                 "convolution engines at each new shape and keep the fastest, or unset it",
                 *value);
  return true;
}

std::atomic<bool>& benchmark_flag() {
  static std::atomic<bool> flag{benchmark_from_env()};
  return flag;
}
}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

void set_cudnn_benchmark(bool on) { benchmark_flag().store(on, std::memory_order_relaxed); }
bool cudnn_benchmark() { return benchmark_flag().load(std::memory_order_relaxed); }

}  // namespace lockstep::runtime::cuda
