// batch_norm's training forward and backward through cuDNN's graph API: the
// key and the operation graph of each direction (cudnn_graph_plan.cpp
// chooses, caches and runs the plans).
#include "lockstep/runtime/cuda/ops/cudnn_graph_batch_norm.h"

#include <array>
#include <atomic>
#include <memory>
#include <vector>

namespace lockstep::runtime::cuda {
namespace {

// Unique ids of the graphs' tensors (the variant pack's keys).
enum Uid : int64_t {
  kX = 1,
  kY,
  kScale,
  kBias,
  kMean,
  kInvStd,
  kEpsilon,
  kMomentum,
  kRunningMeanIn,
  kRunningVarIn,
  kRunningMeanOut,
  kRunningVarOut,
  kDy,
  kDx,
  kDScale,
  kDBias,
};

std::atomic<int64_t> graph_calls{0};
std::atomic<int64_t> legacy_calls{0};

enum class Direction { forward, forward_running, backward };

struct Key {
  std::array<int64_t, 3> geometry{};    // n, c, inner
  std::array<int64_t, 10> alignment{};  // of the data pointers, in operand order
  std::uintptr_t handle = 0;
  int device = 0;
  Direction dir = Direction::forward;
  auto operator<=>(const Key&) const = default;
};

template <std::size_t N>
std::array<int64_t, 10> alignments(const std::array<void*, N>& pointers) {
  static_assert(N <= 10);
  std::array<int64_t, 10> a{};
  for (std::size_t i = 0; i < N; ++i) a[i] = pointer_alignment(pointers[i]);
  return a;
}

// The tensors of one graph and the operation being built from them.
class GraphBuilder {
 public:
  GraphBuilder(const Key& key, cudnnBackendDescriptorType_t op_type) : key_(key), op_(op_type) {}

  BackendDescriptor& op() { return op_; }

  // x, y, dy or dx: NCHW data viewed as [n, c, inner, 1].
  void data(cudnnBackendAttributeName_t attr, int64_t uid, int64_t alignment) {
    const auto [n, c, inner] = key_.geometry;
    const std::array<int64_t, 4> dims{n, c, inner, 1}, strides{c * inner, inner, 1, 1};
    attach(attr, graph_tensor(uid, CUDNN_DATA_FLOAT, dims, strides, alignment));
  }
  // A per-channel [1, c, 1, 1] tensor (strides as cuDNN's own front end
  // writes them for per-channel tensors).
  void channel(cudnnBackendAttributeName_t attr, int64_t uid, int64_t alignment) {
    const int64_t c = key_.geometry[1];
    const std::array<int64_t, 4> dims{1, c, 1, 1}, strides{c, 1, c, c};
    attach(attr, graph_tensor(uid, CUDNN_DATA_FLOAT, dims, strides, alignment));
  }
  void scalar(cudnnBackendAttributeName_t attr, int64_t uid) {
    attach(attr, graph_scalar(uid, CUDNN_DATA_FLOAT));
  }

  std::shared_ptr<const GraphPlan> plan(cudnnHandle_t handle) {
    op_.finalize();
    return make_plan(handle, std::move(op_), std::move(parts_), DType::f32, /*tf32=*/false);
  }

 private:
  void attach(cudnnBackendAttributeName_t attr, BackendDescriptor tensor) {
    op_.set_descriptor(attr, tensor);
    parts_.push_back(std::move(tensor));  // the handle moves with it; op_ still refers to it
  }

  const Key& key_;
  BackendDescriptor op_;
  std::vector<BackendDescriptor> parts_;
};

// Operand order of the forward's pointers (and of its key's alignments).
constexpr std::array<int64_t, 10> kForwardUids{
    kX,     kY,      kScale,        kBias,         kMean,
    kInvStd, kRunningMeanIn, kRunningVarIn, kRunningMeanOut, kRunningVarOut};

std::shared_ptr<const GraphPlan> build_forward(const Key& key, cudnnHandle_t handle) {
  GraphBuilder g(key, CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR);
  const cudnnBackendNormMode_t mode = CUDNN_BATCH_NORM;
  const cudnnBackendNormFwdPhase_t phase = CUDNN_NORM_FWD_TRAINING;
  g.op().set(CUDNN_ATTR_OPERATION_NORM_FWD_MODE, CUDNN_TYPE_NORM_MODE, 1, &mode);
  g.op().set(CUDNN_ATTR_OPERATION_NORM_FWD_PHASE, CUDNN_TYPE_NORM_FWD_PHASE, 1, &phase);
  const auto& a = key.alignment;
  g.data(CUDNN_ATTR_OPERATION_NORM_FWD_XDESC, kX, a[0]);
  g.data(CUDNN_ATTR_OPERATION_NORM_FWD_YDESC, kY, a[1]);
  g.channel(CUDNN_ATTR_OPERATION_NORM_FWD_SCALE_DESC, kScale, a[2]);
  g.channel(CUDNN_ATTR_OPERATION_NORM_FWD_BIAS_DESC, kBias, a[3]);
  g.channel(CUDNN_ATTR_OPERATION_NORM_FWD_MEAN_DESC, kMean, a[4]);
  g.channel(CUDNN_ATTR_OPERATION_NORM_FWD_INV_VARIANCE_DESC, kInvStd, a[5]);
  g.scalar(CUDNN_ATTR_OPERATION_NORM_FWD_EPSILON_DESC, kEpsilon);
  if (key.dir == Direction::forward_running) {
    g.scalar(CUDNN_ATTR_OPERATION_NORM_FWD_EXP_AVG_FACTOR_DESC, kMomentum);
    g.channel(CUDNN_ATTR_OPERATION_NORM_FWD_INPUT_RUNNING_MEAN_DESC, kRunningMeanIn, a[6]);
    g.channel(CUDNN_ATTR_OPERATION_NORM_FWD_INPUT_RUNNING_VAR_DESC, kRunningVarIn, a[7]);
    g.channel(CUDNN_ATTR_OPERATION_NORM_FWD_OUTPUT_RUNNING_MEAN_DESC, kRunningMeanOut, a[8]);
    g.channel(CUDNN_ATTR_OPERATION_NORM_FWD_OUTPUT_RUNNING_VAR_DESC, kRunningVarOut, a[9]);
  }
  return g.plan(handle);
}

// Operand order of the backward's pointers (and of its key's alignments).
constexpr std::array<int64_t, 8> kBackwardUids{kX,      kDy, kScale,  kMean,
                                               kInvStd, kDx, kDScale, kDBias};

std::shared_ptr<const GraphPlan> build_backward(const Key& key, cudnnHandle_t handle) {
  GraphBuilder g(key, CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR);
  const cudnnBackendNormMode_t mode = CUDNN_BATCH_NORM;
  g.op().set(CUDNN_ATTR_OPERATION_NORM_BWD_MODE, CUDNN_TYPE_NORM_MODE, 1, &mode);
  const auto& a = key.alignment;
  g.data(CUDNN_ATTR_OPERATION_NORM_BWD_XDESC, kX, a[0]);
  g.data(CUDNN_ATTR_OPERATION_NORM_BWD_DYDESC, kDy, a[1]);
  g.channel(CUDNN_ATTR_OPERATION_NORM_BWD_SCALE_DESC, kScale, a[2]);
  g.channel(CUDNN_ATTR_OPERATION_NORM_BWD_MEAN_DESC, kMean, a[3]);
  g.channel(CUDNN_ATTR_OPERATION_NORM_BWD_INV_VARIANCE_DESC, kInvStd, a[4]);
  g.data(CUDNN_ATTR_OPERATION_NORM_BWD_DXDESC, kDx, a[5]);
  g.channel(CUDNN_ATTR_OPERATION_NORM_BWD_DSCALE_DESC, kDScale, a[6]);
  g.channel(CUDNN_ATTR_OPERATION_NORM_BWD_DBIAS_DESC, kDBias, a[7]);
  return g.plan(handle);
}

PlanCache<Key>& cache() {
  static auto* c = new PlanCache<Key>;
  return *c;
}

// The plan for the key, or null when the legacy call must run it.
std::shared_ptr<const GraphPlan> plan_for(const Key& key, DType dtype, cudnnHandle_t handle) {
  if (dtype != DType::f32 || cudnn_legacy_forced()) return nullptr;
  return cache().get(key, [&] {
    return key.dir == Direction::backward ? build_backward(key, handle)
                                          : build_forward(key, handle);
  });
}

bool counted(bool ran) {
  (ran ? graph_calls : legacy_calls).fetch_add(1, std::memory_order_relaxed);
  return ran;
}

}  // namespace

bool graph_batch_norm_forward(cudnnHandle_t handle, int64_t n, int64_t c, int64_t inner,
                              DType dtype, int device, double momentum, double eps,
                              const BatchNormForwardOperands& p) {
  const bool running = p.running_mean_in != nullptr;
  const std::array<void*, 10> data{p.x,           p.y,
                                   p.scale,         p.bias,
                                   p.save_mean,     p.save_invstd,
                                   p.running_mean_in, p.running_var_in,
                                   p.running_mean_out, p.running_var_out};
  const Key key{{n, c, inner},
                alignments(data),
                reinterpret_cast<std::uintptr_t>(handle),
                device,
                running ? Direction::forward_running : Direction::forward};
  const std::shared_ptr<const GraphPlan> plan = plan_for(key, dtype, handle);
  if (plan == nullptr) return counted(false);

  // eps and momentum by value, as f32 (the graph's compute type).
  float eps_value = static_cast<float>(eps), momentum_value = static_cast<float>(momentum);
  std::vector<void*> pointers(data.begin(), data.begin() + 6);
  std::vector<int64_t> uids(kForwardUids.begin(), kForwardUids.begin() + 6);
  pointers.push_back(&eps_value);
  uids.push_back(kEpsilon);
  if (running) {
    pointers.insert(pointers.end(), data.begin() + 6, data.end());
    uids.insert(uids.end(), kForwardUids.begin() + 6, kForwardUids.end());
    pointers.push_back(&momentum_value);
    uids.push_back(kMomentum);
  }
  execute_plan(handle, *plan, pointers, uids, device);
  return counted(true);
}

bool graph_batch_norm_backward(cudnnHandle_t handle, int64_t n, int64_t c, int64_t inner,
                               DType dtype, int device, const BatchNormBackwardOperands& p) {
  const std::array<void*, 8> data{p.x,           p.dy, p.scale,  p.save_mean,
                                  p.save_invstd, p.dx, p.dscale, p.dbias};
  const Key key{{n, c, inner},
                alignments(data),
                reinterpret_cast<std::uintptr_t>(handle),
                device,
                Direction::backward};
  const std::shared_ptr<const GraphPlan> plan = plan_for(key, dtype, handle);
  if (plan == nullptr) return counted(false);
  execute_plan(handle, *plan, data, kBackwardUids, device);
  return counted(true);
}

CudnnPathStats batch_norm_path_stats() {
  return {graph_calls.load(std::memory_order_relaxed),
          legacy_calls.load(std::memory_order_relaxed)};
}

}  // namespace lockstep::runtime::cuda
