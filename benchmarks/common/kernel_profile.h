// Where a step's GPU time goes: a device activity trace (lockstep's,
// runtime::DeviceBackend::trace_activity, or PyTorch's profiler's) summed
// per kernel and per kind of work, per step, and two of them side by side.
// "busy" is the union of the activities' intervals (the time the GPU was
// doing anything); a step's wall time minus it is time the GPU waited for
// the host: launches, synchronisation, Python.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "lockstep/runtime/device_backend.h"

namespace lockstep::bench {

struct KernelStat {
  std::string name;  // short_kernel_name
  int64_t calls = 0;
  double total_us = 0;
};

struct KernelProfile {
  int steps = 0;
  int64_t activities = 0;  // kernels, copies and fills, all steps
  double busy_us = 0;      // union of their intervals, all steps
  double sum_us = 0;       // sum of their durations, all steps
  std::vector<KernelStat> kernels;  // largest total first

  double per_step(double total) const { return steps > 0 ? total / steps : 0; }
  nlohmann::json to_json(int top = 15) const;
};

// A demangled kernel name without its return type, scopes, template
// arguments and parameters ("void at::native::foo<4, F>(int)" -> "foo"), cut
// to 60 characters; cuDNN's and copies' names as they are (also cut).
std::string short_kernel_name(const std::string& name);

// The kind of work a kernel does, from its name: collective (NCCL), copy,
// conv, gemm, norm, softmax/loss, pool, optimizer, reduce, elementwise, or other.
std::string kernel_category(const std::string& name);

// --kernel-trace: refused off a GPU; else one trace is started and stopped,
// so that a machine where tracing cannot work (no CUPTI) fails before
// anything is timed.
void check_kernel_trace(int steps, const runtime::Device& device);

// `steps` calls of `step` on `device` under a device activity trace, summarized.
KernelProfile trace_steps(const runtime::Device& device, int steps,
                          const std::function<void()>& step);

// Sums `activities` (from `steps` steps) per short kernel name.
KernelProfile summarize_activities(const std::vector<runtime::DeviceActivity>& activities,
                                   int steps);

// Activities from a peer's JSON: a list of [name, start us, end us].
std::vector<runtime::DeviceActivity> activities_from_json(const nlohmann::json& list);

// Per category, microseconds per step, largest first.
std::vector<std::pair<std::string, double>> category_us_per_step(const KernelProfile& profile);

// One side of a comparison: its name ("lockstep", "PyTorch", "DDP"), its
// profile, and its step's wall time where measured.
struct ProfiledSide {
  std::string name;
  KernelProfile profile;
  std::optional<double> wall_ms;
};

// A table: per category and overall, microseconds per step of `a` beside
// `b` (if any), then each side's `top` kernels.
std::string compare_profiles(const std::string& title, const ProfiledSide& a,
                             const std::optional<ProfiledSide>& b, int top = 10);

}  // namespace lockstep::bench
