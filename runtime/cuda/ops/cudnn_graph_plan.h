// What the ops on cuDNN's graph (backend) API share: graph tensors, the
// engine choice for a one-operation graph, a process-wide plan cache with
// "no plan: use the legacy API" entries, and execution. Used by
// cudnn_graph_conv.cpp and cudnn_graph_batch_norm.cpp.
//
// Engine choice: cuDNN's heuristics in mode A, then mode FALLBACK; the first
// engine config whose plan finalizes with a workspace of at most 1 GiB (else
// the one needing the least). Engines that would change the numerics are
// passed over: those that down-convert inputs or reduce in reduced precision,
// and for f32 without allow_tf32() (math_mode.h) those on tensor cores, which
// compute f32 in TF32. Building runs nothing on the GPU.
//
// Benchmark mode (cudnn_benchmark(), math_mode.h: PyTorch's
// torch.backends.cudnn.benchmark), for plans whose op overwrites its outputs
// from its inputs alone: up to 12 such engine configs are finalized, and the
// plan's first run times each on that run's own operands (one warm-up run,
// then three timed with CUDA events) and keeps the fastest for good.
#pragma once

#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "lockstep/runtime/cuda/ops/cudnn_backend_descriptor.h"
#include "lockstep/runtime/dtype.h"
#include "lockstep/runtime/error.h"

namespace lockstep::runtime::cuda {

// One engine config of a graph and its finalized execution plan.
struct GraphEngine {
  BackendDescriptor config;
  BackendDescriptor exec;
  std::size_t workspace = 0;
};

// The finalized execution plans of a graph and every descriptor they were
// built from, which cuDNN may refer to while the plan lives.
struct GraphPlan {
  std::vector<BackendDescriptor> parts;
  std::vector<GraphEngine> engines;  // the heuristics' first; several to time in benchmark mode
  // The engine that runs: engines[0], or in benchmark mode the fastest,
  // chosen at the first run (plans are per handle, so per thread).
  mutable std::once_flag timed;
  mutable std::size_t chosen = 0;
};

// The largest power of two up to 16 that divides the address: the alignment
// a plan may assume of a pointer it runs on (so it belongs in plan keys).
int64_t pointer_alignment(const void* p);

// A tensor of a graph in device memory: `dims` and `strides` in elements.
BackendDescriptor graph_tensor(int64_t uid, cudnnDataType_t type, std::span<const int64_t> dims,
                               std::span<const int64_t> strides, int64_t alignment);

// A scalar passed by value: the variant pack gives a host pointer to it.
BackendDescriptor graph_scalar(int64_t uid, cudnnDataType_t type);

// The graph of the one finalized operation `op` on `handle`, and the plan
// cuDNN's engines offer for it (see the top of this file); null when there is
// none. `parts` are the descriptors `op` refers to; the plan keeps them, and
// `op`, alive. `benchmark`: keep several engines to time at the first run
// (only for an op that overwrites its outputs from its inputs alone). Throws
// lockstep::Error when cuDNN refuses the graph itself.
std::shared_ptr<const GraphPlan> make_plan(cudnnHandle_t handle, BackendDescriptor op,
                                           std::vector<BackendDescriptor> parts, DType dtype,
                                           bool tf32, bool benchmark = false);

// Runs `plan` on `handle` with pointers[i] for the tensor of uids[i] and a
// workspace from the caching allocator on `device`'s current stream (first
// timing its engines, in benchmark mode). Throws when cuDNN fails.
void execute_plan(cudnnHandle_t handle, const GraphPlan& plan, std::span<void* const> pointers,
                  std::span<const int64_t> uids, int device);

// True when LOCKSTEP_CUDNN_LEGACY=1 (read once, on first use): every cuDNN
// convolution and batch norm then takes the legacy API. Unset or 0: the graph
// API first. Throws naming the variable for any other value.
bool cudnn_legacy_forced();

// cuDNN calls of one op so far in this process, by API. For tests.
struct CudnnPathStats {
  int64_t graph = 0;
  int64_t legacy = 0;
};

// Plans by key for the process, null entries meaning "the legacy API runs
// this key" (cuDNN refused the graph or has no engine that keeps the
// numerics): remembered, not asked again. Keys must name the handle (a plan
// is bound to it; handles are one per device per thread, cudnn_handle.h).
// Leaked on purpose, like the other caches: plans must not be destroyed
// after cuDNN is torn down at exit.
template <class Key>
class PlanCache {
 public:
  // The cached plan for `key`, else build() (returning a plan or null; a
  // lockstep::Error counts as null) cached and returned.
  template <class Build>
  std::shared_ptr<const GraphPlan> get(const Key& key, Build&& build) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto it = plans_.find(key);
      if (it != plans_.end()) return it->second;
    }
    // Built outside the lock; no other thread builds this key (it names this
    // thread's handle).
    std::shared_ptr<const GraphPlan> plan;
    try {
      plan = std::forward<Build>(build)();
    } catch (const Error&) {
      plan = nullptr;  // an unsupported shape, dtype or layout
    }
    std::lock_guard<std::mutex> lock(mutex_);
    return plans_.try_emplace(key, std::move(plan)).first->second;
  }

 private:
  std::mutex mutex_;
  std::map<Key, std::shared_ptr<const GraphPlan>> plans_;
};

}  // namespace lockstep::runtime::cuda
