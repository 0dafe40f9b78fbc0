// conv2d through cuDNN's graph API: the operation graph, the engine choice,
// the plan cache and execution.
#include "lockstep/runtime/cuda/ops/cudnn_graph_conv.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/runtime/cuda/caching_allocator.h"
#include "lockstep/runtime/cuda/cudnn_check.h"
#include "lockstep/runtime/cuda/ops/cudnn_backend_descriptor.h"
#include "lockstep/runtime/cuda/ops/cudnn_handle.h"
#include "lockstep/runtime/cuda/ops/math_mode.h"
#include "lockstep/runtime/cuda/stream.h"
#include "lockstep/runtime/env.h"
#include "lockstep/runtime/error.h"

namespace lockstep::runtime::cuda {
namespace {

using conv_kernels::ConvShape;

// Engine configs whose workspace exceeds this are passed over while another
// fits (the legacy path's bound too).
constexpr std::size_t kMaxWorkspace = std::size_t{1} << 30;

// Unique ids of the three tensors of every graph (the variant pack's keys).
constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3;

std::atomic<int64_t> graph_calls{0};
std::atomic<int64_t> legacy_calls{0};

// The largest power of two up to 16 that divides the address: the alignment
// a plan may assume of the pointers it runs on.
int64_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  int64_t a = 1;
  while (a < 16 && address % static_cast<std::uintptr_t>(2 * a) == 0) a *= 2;
  return a;
}

struct Key {
  std::array<int64_t, 16> geometry{};
  std::array<int64_t, 3> alignment{};  // of x, w, y
  std::uintptr_t handle = 0;
  int device = 0;
  ConvDirection dir = ConvDirection::forward;
  DType dtype = DType::f32;
  bool tf32 = false;
  auto operator<=>(const Key&) const = default;
};

Key make_key(cudnnHandle_t handle, ConvDirection dir, const ConvShape& s, DType dtype, int device,
             const ConvOperands& p) {
  return {{s.n, s.c_in, s.h, s.w, s.c_out, s.kh, s.kw, s.sh, s.sw, s.ph, s.pw, s.dh, s.dw, s.groups,
           s.oh, s.ow},
          {alignment_of(p.x), alignment_of(p.w), alignment_of(p.y)},
          reinterpret_cast<std::uintptr_t>(handle),
          device,
          dir,
          dtype,
          allow_tf32()};
}

// A finalized execution plan and every descriptor it was built from, which
// cuDNN may refer to while the plan lives.
struct Plan {
  std::vector<BackendDescriptor> parts;
  BackendDescriptor exec;
  std::size_t workspace = 0;
};

// ---- the operation graph ---------------------------------------------------

// A packed NCHW tensor.
BackendDescriptor tensor(int64_t uid, cudnnDataType_t type, std::array<int64_t, 4> dims,
                         int64_t alignment) {
  const std::array<int64_t, 4> strides{dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
  BackendDescriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  t.set_data_type(CUDNN_ATTR_TENSOR_DATA_TYPE, type);
  t.set_int64s(CUDNN_ATTR_TENSOR_DIMENSIONS, dims);
  t.set_int64s(CUDNN_ATTR_TENSOR_STRIDES, strides);
  t.set_int64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid);
  t.set_int64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, alignment);
  t.finalize();
  return t;
}

// Cross-correlation over 2 spatial dims, padded alike on both sides (conv.cpp
// computes oh, ow with the division rounded down, as cuDNN does).
BackendDescriptor convolution(const ConvShape& s, cudnnDataType_t compute) {
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const std::array<int64_t, 2> padding{s.ph, s.pw}, stride{s.sh, s.sw}, dilation{s.dh, s.dw};
  BackendDescriptor c(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  c.set_data_type(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, compute);
  c.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  c.set_int64(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, 2);
  c.set_int64s(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, padding);
  c.set_int64s(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, padding);
  c.set_int64s(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, stride);
  c.set_int64s(CUDNN_ATTR_CONVOLUTION_DILATIONS, dilation);
  c.finalize();
  return c;
}

// The operation descriptor type of a direction and its attribute names.
struct OperationAttrs {
  cudnnBackendDescriptorType_t type;
  cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
};

OperationAttrs operation_attrs(ConvDirection dir) {
  switch (dir) {
    case ConvDirection::forward:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
    case ConvDirection::backward_data:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
    case ConvDirection::backward_filter:
      break;
  }
  return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
}

// out = 1 * conv(...) + 0 * out. Scaling factors are double for f64 data,
// float otherwise, as in the legacy API.
BackendDescriptor operation(ConvDirection dir, DType dtype, const BackendDescriptor& x,
                            const BackendDescriptor& w, const BackendDescriptor& y,
                            const BackendDescriptor& conv) {
  const OperationAttrs a = operation_attrs(dir);
  BackendDescriptor op(a.type);
  op.set_descriptor(a.x, x);
  op.set_descriptor(a.w, w);
  op.set_descriptor(a.y, y);
  op.set_descriptor(a.conv, conv);
  if (dtype == DType::f64) {
    const double alpha = 1.0, beta = 0.0;
    op.set(a.alpha, CUDNN_TYPE_DOUBLE, 1, &alpha);
    op.set(a.beta, CUDNN_TYPE_DOUBLE, 1, &beta);
  } else {
    const float alpha = 1.0f, beta = 0.0f;
    op.set(a.alpha, CUDNN_TYPE_FLOAT, 1, &alpha);
    op.set(a.beta, CUDNN_TYPE_FLOAT, 1, &beta);
  }
  op.finalize();
  return op;
}

// ---- the engine choice -----------------------------------------------------

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

struct Choice {
  BackendDescriptor config;
  BackendDescriptor exec;
  std::size_t workspace = 0;
};

// The execution plan of the first usable engine config (see the header), or
// nullopt when there is none.
std::optional<Choice> choose(cudnnHandle_t handle, const BackendDescriptor& graph, DType dtype,
                             bool tf32) {
  std::optional<Choice> smallest;  // the least workspace seen, should none fit the bound
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    for (BackendDescriptor& config : engine_configs(graph, mode)) {
      if (!keeps_numerics(config, dtype, tf32)) continue;
      BackendDescriptor exec(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      exec.set_handle(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle);
      exec.set_descriptor(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
      if (exec.try_finalize() != CUDNN_STATUS_SUCCESS) continue;  // not for this graph
      const auto workspace =
          static_cast<std::size_t>(exec.get_int64(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE));
      Choice c{std::move(config), std::move(exec), workspace};
      if (workspace <= kMaxWorkspace) return c;
      if (!smallest || workspace < smallest->workspace) smallest = std::move(c);
    }
  }
  return smallest;
}

// The plan for `key`, or null when cuDNN has none (throws on a cuDNN error).
std::shared_ptr<const Plan> build(const Key& key, const ConvShape& s, cudnnHandle_t handle) {
  const cudnnDataType_t type = cudnn_data_type(key.dtype, "conv2d");
  const cudnnDataType_t compute = key.dtype == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  // Groups are implied by the channels: x has c_in, the weight c_in / groups.
  BackendDescriptor x = tensor(kUidX, type, {s.n, s.c_in, s.h, s.w}, key.alignment[0]);
  BackendDescriptor w = tensor(kUidW, type, {s.c_out, s.cin_g(), s.kh, s.kw}, key.alignment[1]);
  BackendDescriptor y = tensor(kUidY, type, {s.n, s.c_out, s.oh, s.ow}, key.alignment[2]);
  BackendDescriptor conv = convolution(s, compute);
  BackendDescriptor op = operation(key.dir, key.dtype, x, w, y, conv);
  // The graph and the plan name the handle. cuDNN 9's headers mark these
  // attributes deprecated in favour of device-property descriptors (9.8 on);
  // they are still supported, and they tie the plan to the key's handle.
  BackendDescriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.set_descriptor(CUDNN_ATTR_OPERATIONGRAPH_OPS, op);
  graph.set_handle(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, handle);
  graph.finalize();

  std::optional<Choice> c = choose(handle, graph, key.dtype, key.tf32);
  if (!c) return nullptr;
  std::vector<BackendDescriptor> parts;
  for (BackendDescriptor* d : {&x, &w, &y, &conv, &op, &graph, &c->config})
    parts.push_back(std::move(*d));
  return std::make_shared<const Plan>(Plan{std::move(parts), std::move(c->exec), c->workspace});
}

// ---- the plan cache --------------------------------------------------------

// Null entries: no plan, the legacy API runs the key. Leaked on purpose, like
// the other caches (plans must not be destroyed after cuDNN is torn down).
std::mutex& cache_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::map<Key, std::shared_ptr<const Plan>>& cache() {
  static auto* c = new std::map<Key, std::shared_ptr<const Plan>>;
  return *c;
}

std::shared_ptr<const Plan> plan_for(const Key& key, const ConvShape& s, cudnnHandle_t handle) {
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    const auto it = cache().find(key);
    if (it != cache().end()) return it->second;
  }
  // Built outside the lock; no other thread builds this key (it names this
  // thread's handle).
  std::shared_ptr<const Plan> plan;
  try {
    plan = build(key, s, handle);
  } catch (const Error&) {
    // cuDNN refused the graph (an unsupported shape, dtype or layout): the
    // legacy API takes this key.
    plan = nullptr;
  }
  std::lock_guard<std::mutex> lock(cache_mutex());
  return cache().try_emplace(key, std::move(plan)).first->second;
}

void execute(cudnnHandle_t handle, const Plan& plan, const ConvOperands& p, int device) {
  // Freed once the work is queued: later work on the stream reuses it in order.
  DeviceBuffer ws =
      plan.workspace == 0 ? DeviceBuffer() : DeviceBuffer(plan.workspace, current_stream(device));
  void* workspace = ws.data();
  const std::array<void*, 3> pointers{p.x, p.w, p.y};
  const std::array<int64_t, 3> uids{kUidX, kUidW, kUidY};
  BackendDescriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, pointers.data());
  pack.set_int64s(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids);
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  LOCKSTEP_CUDNN_CHECK(cudnnBackendExecute(handle, plan.exec.get(), pack.get()));
}

}  // namespace

bool graph_conv(cudnnHandle_t handle, ConvDirection dir, const ConvShape& s, DType dtype,
                int device, const ConvOperands& p) {
  std::shared_ptr<const Plan> plan;
  if (!cudnn_legacy_forced())
    plan = plan_for(make_key(handle, dir, s, dtype, device, p), s, handle);
  if (plan == nullptr) {
    legacy_calls.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  execute(handle, *plan, p, device);
  graph_calls.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool cudnn_legacy_forced() {
  static const bool forced = [] {
    const std::optional<std::string> value = process_env()("LOCKSTEP_CUDNN_LEGACY");
    if (!value || value->empty() || *value == "0") return false;
    LOCKSTEP_CHECK(*value == "1",
                   "LOCKSTEP_CUDNN_LEGACY='{}' is neither 0 nor 1; set it to 1 to run cuDNN "
                   "convolutions through cuDNN's legacy API only, or unset it",
                   *value);
    return true;
  }();
  return forced;
}

ConvPathStats conv_path_stats() {
  return {graph_calls.load(std::memory_order_relaxed),
          legacy_calls.load(std::memory_order_relaxed)};
}

}  // namespace lockstep::runtime::cuda
