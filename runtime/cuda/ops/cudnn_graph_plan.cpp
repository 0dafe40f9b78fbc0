// Graph tensors, the engine choice, plan building and execution for the ops
// on cuDNN's graph API.
#include "lockstep/runtime/cuda/ops/cudnn_graph_plan.h"

#include <algorithm>
#include <array>
#include <limits>
#include <optional>
#include <string>

#include "lockstep/runtime/cuda/caching_allocator.h"
#include "lockstep/runtime/cuda/cudnn_check.h"
#include "lockstep/runtime/cuda/stream.h"
#include "lockstep/runtime/env.h"

namespace lockstep::runtime::cuda {
namespace {

// Engine configs whose workspace exceeds this are passed over while another
// fits (the legacy convolution path's bound too).
constexpr std::size_t kMaxWorkspace = std::size_t{1} << 30;
// Benchmark mode: the most engine configs timed per plan, and the timed runs of each.
constexpr std::size_t kMaxTimedEngines = 12;
constexpr int kTimedRuns = 3;

// The engine configs cuDNN's heuristics in `mode` propose for the graph, best
// first; none when the heuristic has nothing for it.
std::vector<BackendDescriptor> engine_configs(const BackendDescriptor& graph,
                                              cudnnBackendHeurMode_t mode) {
  BackendDescriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heur.set_descriptor(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (heur.try_finalize() != CUDNN_STATUS_SUCCESS) return {};
  const int64_t count =
      heur.get(CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, nullptr);
  std::vector<BackendDescriptor> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  if (count == 0) return configs;
  const int64_t got =
      heur.get(CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, raw.data());
  configs.erase(configs.begin() + std::clamp<int64_t>(got, 0, count), configs.end());
  return configs;
}

// Whether the engine of `config` keeps the numerics asked for (see the header).
bool keeps_numerics(const BackendDescriptor& config, DType dtype, bool tf32) {
  BackendDescriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t raw = engine.get();
  config.get(CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  const int64_t count = engine.get(CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                   static_cast<int64_t>(notes.size()), notes.data());
  const auto known = static_cast<std::size_t>(std::clamp<int64_t>(count, 0, notes.size()));
  for (std::size_t i = 0; i < known; ++i) {
    switch (notes[i]) {
      case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS:
      case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION:
        return false;
      case CUDNN_NUMERICAL_NOTE_TENSOR_CORE:
        if (dtype == DType::f32 && !tf32) return false;
        break;
      default:
        break;
    }
  }
  return true;
}

// The execution plans of the first `wanted` usable engine configs (see the
// header), best first; else the one needing the least workspace; else none.
std::vector<GraphEngine> choose(cudnnHandle_t handle, const BackendDescriptor& graph, DType dtype,
                                bool tf32, std::size_t wanted) {
  std::vector<GraphEngine> fitting;
  std::optional<GraphEngine> smallest;  // the least workspace seen, should none fit the bound
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    for (BackendDescriptor& config : engine_configs(graph, mode)) {
      if (!keeps_numerics(config, dtype, tf32)) continue;
      BackendDescriptor exec(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      exec.set_handle(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle);
      exec.set_descriptor(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
      if (exec.try_finalize() != CUDNN_STATUS_SUCCESS) continue;  // not for this graph
      const auto workspace =
          static_cast<std::size_t>(exec.get_int64(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE));
      GraphEngine e{std::move(config), std::move(exec), workspace};
      if (workspace <= kMaxWorkspace) {
        fitting.push_back(std::move(e));
        if (fitting.size() == wanted) return fitting;
      } else if (!smallest || workspace < smallest->workspace) {
        smallest = std::move(e);
      }
    }
    if (!fitting.empty()) return fitting;  // the fallback heuristic only where mode A has none
  }
  if (smallest) fitting.push_back(std::move(*smallest));
  return fitting;
}

// Runs one engine of a plan (see execute_plan).
void run_engine(cudnnHandle_t handle, const GraphEngine& engine, std::span<void* const> pointers,
                std::span<const int64_t> uids, int device) {
  // Freed once the work is queued: later work on the stream reuses it in order.
  DeviceBuffer ws = engine.workspace == 0
                        ? DeviceBuffer()
                        : DeviceBuffer(engine.workspace, current_stream(device));
  void* workspace = ws.data();
  BackendDescriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
           static_cast<int64_t>(pointers.size()), pointers.data());
  pack.set_int64s(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids);
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  LOCKSTEP_CUDNN_CHECK(cudnnBackendExecute(handle, engine.exec.get(), pack.get()));
}

// Benchmark mode: the index of the fastest of `plan`'s engines on these
// operands. An engine that fails to run is passed over; if all do, the first
// is kept (its error is then thrown by the run that follows).
std::size_t fastest_engine(cudnnHandle_t handle, const GraphPlan& plan,
                           std::span<void* const> pointers, std::span<const int64_t> uids,
                           int device) {
  const StreamView stream = current_stream(device);
  std::size_t best = 0;
  float best_ms = std::numeric_limits<float>::infinity();
  for (std::size_t i = 0; i < plan.engines.size(); ++i) {
    try {
      run_engine(handle, plan.engines[i], pointers, uids, device);  // warm-up, module loading
      Event start({.timing = true}), end({.timing = true});
      start.record(stream);
      for (int r = 0; r < kTimedRuns; ++r) run_engine(handle, plan.engines[i], pointers, uids, device);
      end.record(stream);
      end.synchronize();
      const float ms = start.elapsed_ms(end);
      if (ms < best_ms) {
        best = i;
        best_ms = ms;
      }
    } catch (const Error&) {
      continue;  // this engine cannot run these operands
    }
  }
  return best;
}

// A finalized tensor descriptor; by value: the variant pack gives a host
// pointer to its one element.
BackendDescriptor tensor_descriptor(int64_t uid, cudnnDataType_t type,
                                    std::span<const int64_t> dims,
                                    std::span<const int64_t> strides, int64_t alignment,
                                    bool by_value) {
  BackendDescriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  t.set_data_type(CUDNN_ATTR_TENSOR_DATA_TYPE, type);
  t.set_int64s(CUDNN_ATTR_TENSOR_DIMENSIONS, dims);
  t.set_int64s(CUDNN_ATTR_TENSOR_STRIDES, strides);
  t.set_int64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid);
  t.set_int64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, alignment);
  if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
  t.finalize();
  return t;
}

}  // namespace

int64_t pointer_alignment(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  int64_t a = 1;
  while (a < 16 && address % static_cast<std::uintptr_t>(2 * a) == 0) a *= 2;
  return a;
}

BackendDescriptor graph_tensor(int64_t uid, cudnnDataType_t type, std::span<const int64_t> dims,
                               std::span<const int64_t> strides, int64_t alignment) {
  return tensor_descriptor(uid, type, dims, strides, alignment, /*by_value=*/false);
}

BackendDescriptor graph_scalar(int64_t uid, cudnnDataType_t type) {
  const std::array<int64_t, 4> ones{1, 1, 1, 1};
  return tensor_descriptor(uid, type, ones, ones, 16, /*by_value=*/true);
}

std::shared_ptr<const GraphPlan> make_plan(cudnnHandle_t handle, BackendDescriptor op,
                                           std::vector<BackendDescriptor> parts, DType dtype,
                                           bool tf32, bool benchmark) {
  // The graph and the plan name the handle. cuDNN 9's headers mark these
  // attributes deprecated in favour of device-property descriptors (9.8 on);
  // they are still supported, and they tie the plan to the key's handle.
  BackendDescriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.set_descriptor(CUDNN_ATTR_OPERATIONGRAPH_OPS, op);
  graph.set_handle(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, handle);
  graph.finalize();

  std::vector<GraphEngine> engines =
      choose(handle, graph, dtype, tf32, benchmark ? kMaxTimedEngines : 1);
  if (engines.empty()) return nullptr;
  parts.push_back(std::move(op));
  parts.push_back(std::move(graph));
  auto plan = std::make_shared<GraphPlan>();
  plan->parts = std::move(parts);
  plan->engines = std::move(engines);
  return plan;
}

void execute_plan(cudnnHandle_t handle, const GraphPlan& plan, std::span<void* const> pointers,
                  std::span<const int64_t> uids, int device) {
  LOCKSTEP_CHECK(pointers.size() == uids.size(),
                 "cuDNN graph: {} data pointers for {} tensor ids", pointers.size(), uids.size());
  if (plan.engines.size() > 1) {
    std::call_once(plan.timed, [&] {
      plan.chosen = fastest_engine(handle, plan, pointers, uids, device);
    });
  }
  run_engine(handle, plan.engines[plan.chosen], pointers, uids, device);
}

bool cudnn_legacy_forced() {
  static const bool forced = read_switch(
      process_env(), "LOCKSTEP_CUDNN_LEGACY",
      "run cuDNN convolutions and batch norms through cuDNN's legacy API only");
  return forced;
}

}  // namespace lockstep::runtime::cuda
