#include "lockstep/runtime/cuda/ops/math_mode.h"

#include <atomic>

#include "lockstep/runtime/env.h"

namespace lockstep::runtime::cuda {

namespace {
std::atomic<bool> g_allow_tf32{false};

std::atomic<bool>& benchmark_flag() {
  static std::atomic<bool> flag{read_switch(
      process_env(), "LOCKSTEP_CUDNN_BENCHMARK",
      "time cuDNN's convolution engines at each new shape and keep the fastest")};
  return flag;
}
}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

void set_cudnn_benchmark(bool on) { benchmark_flag().store(on, std::memory_order_relaxed); }
bool cudnn_benchmark() { return benchmark_flag().load(std::memory_order_relaxed); }

}  // namespace lockstep::runtime::cuda
