// conv2d through cuDNN's graph API: the key and the operation graph of each
// direction (cudnn_graph_plan.cpp chooses, caches and runs the plans).
#include "lockstep/runtime/cuda/ops/cudnn_graph_conv.h"

#include <array>
#include <atomic>
#include <memory>
#include <vector>

#include "lockstep/runtime/cuda/ops/cudnn_graph_plan.h"
#include "lockstep/runtime/cuda/ops/cudnn_handle.h"
#include "lockstep/runtime/cuda/ops/math_mode.h"

namespace lockstep::runtime::cuda {
namespace {

using conv_kernels::ConvShape;

// Unique ids of the three tensors of every graph (the variant pack's keys).
constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3;

std::atomic<int64_t> graph_calls{0};
std::atomic<int64_t> legacy_calls{0};

struct Key {
  std::array<int64_t, 16> geometry{};
  std::array<int64_t, 3> alignment{};  // of x, w, y
  std::uintptr_t handle = 0;
  int device = 0;
  ConvDirection dir = ConvDirection::forward;
  DType dtype = DType::f32;
  bool tf32 = false;
  bool benchmark = false;  // cudnn_benchmark(): time the engines at the first run
  auto operator<=>(const Key&) const = default;
};

Key make_key(cudnnHandle_t handle, ConvDirection dir, const ConvShape& s, DType dtype, int device,
             const ConvOperands& p) {
  return {{s.n, s.c_in, s.h, s.w, s.c_out, s.kh, s.kw, s.sh, s.sw, s.ph, s.pw, s.dh, s.dw, s.groups,
           s.oh, s.ow},
          {pointer_alignment(p.x), pointer_alignment(p.w), pointer_alignment(p.y)},
          reinterpret_cast<std::uintptr_t>(handle),
          device,
          dir,
          dtype,
          allow_tf32(),
          cudnn_benchmark()};
}

// ---- the operation graph ---------------------------------------------------

// A packed NCHW tensor.
BackendDescriptor tensor(int64_t uid, cudnnDataType_t type, std::array<int64_t, 4> dims,
                         int64_t alignment) {
  const std::array<int64_t, 4> strides{dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
  return graph_tensor(uid, type, dims, strides, alignment);
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

// The plan for `key`, or null when cuDNN has none (throws on a cuDNN error).
std::shared_ptr<const GraphPlan> build(const Key& key, const ConvShape& s, cudnnHandle_t handle) {
  const cudnnDataType_t type = cudnn_data_type(key.dtype, "conv2d");
  const cudnnDataType_t compute = key.dtype == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  // Groups are implied by the channels: x has c_in, the weight c_in / groups.
  BackendDescriptor x = tensor(kUidX, type, {s.n, s.c_in, s.h, s.w}, key.alignment[0]);
  BackendDescriptor w = tensor(kUidW, type, {s.c_out, s.cin_g(), s.kh, s.kw}, key.alignment[1]);
  BackendDescriptor y = tensor(kUidY, type, {s.n, s.c_out, s.oh, s.ow}, key.alignment[2]);
  BackendDescriptor conv = convolution(s, compute);
  BackendDescriptor op = operation(key.dir, key.dtype, x, w, y, conv);
  std::vector<BackendDescriptor> parts;
  for (BackendDescriptor* d : {&x, &w, &y, &conv}) parts.push_back(std::move(*d));
  // Every direction overwrites its output (beta 0) from its two inputs, so
  // timing engines on the real operands changes nothing the run keeps.
  return make_plan(handle, std::move(op), std::move(parts), key.dtype, key.tf32, key.benchmark);
}

PlanCache<Key>& cache() {
  static auto* c = new PlanCache<Key>;
  return *c;
}

}  // namespace

bool graph_conv(cudnnHandle_t handle, ConvDirection dir, const ConvShape& s, DType dtype,
                int device, const ConvOperands& p) {
  std::shared_ptr<const GraphPlan> plan;
  if (!cudnn_legacy_forced()) {
    const Key key = make_key(handle, dir, s, dtype, device, p);
    plan = cache().get(key, [&] { return build(key, s, handle); });
  }
  if (plan == nullptr) {
    legacy_calls.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  const std::array<void*, 3> pointers{p.x, p.w, p.y};
  const std::array<int64_t, 3> uids{kUidX, kUidW, kUidY};
  execute_plan(handle, *plan, pointers, uids, device);
  graph_calls.fetch_add(1, std::memory_order_relaxed);
  return true;
}

CudnnPathStats conv_path_stats() {
  return {graph_calls.load(std::memory_order_relaxed),
          legacy_calls.load(std::memory_order_relaxed)};
}

}  // namespace lockstep::runtime::cuda
