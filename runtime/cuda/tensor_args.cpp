#include "lockstep/runtime/cuda/tensor_args.h"

#include <vector>

#include "lockstep/runtime/cuda/core/coalesce_dims.h"
#include "lockstep/runtime/cuda/stream.h"

namespace lockstep::runtime::cuda {

namespace {

using kernels::ScalarType;
static_assert(static_cast<int>(ScalarType::f32) == static_cast<int>(DType::f32));
static_assert(static_cast<int>(ScalarType::f64) == static_cast<int>(DType::f64));
static_assert(static_cast<int>(ScalarType::bf16) == static_cast<int>(DType::bf16));
static_assert(static_cast<int>(ScalarType::f16) == static_cast<int>(DType::f16));
static_assert(static_cast<int>(ScalarType::i32) == static_cast<int>(DType::i32));
static_assert(static_cast<int>(ScalarType::i64) == static_cast<int>(DType::i64));
static_assert(static_cast<int>(ScalarType::u8) == static_cast<int>(DType::u8));
static_assert(static_cast<int>(ScalarType::boolean) == static_cast<int>(DType::boolean));

// Strides of `t` broadcast to `shape` (0 where t has size 1 or lacks the dim).
std::vector<int64_t> broadcast_strides(const Tensor& t, const Shape& shape) {
  LOCKSTEP_CHECK(t.dim() <= static_cast<int64_t>(shape.size()),
                 "CUDA kernel: operand of shape {} does not broadcast to {}", shape_str(t.shape()),
                 shape_str(shape));
  std::vector<int64_t> st(shape.size(), 0);
  const size_t lead = shape.size() - t.shape().size();
  for (size_t i = 0; i < t.shape().size(); ++i) {
    LOCKSTEP_CHECK(t.shape()[i] == shape[lead + i] || t.shape()[i] == 1,
                   "CUDA kernel: operand of shape {} does not broadcast to {}",
                   shape_str(t.shape()), shape_str(shape));
    st[lead + i] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  }
  return st;
}

}  // namespace

ScalarType scalar_type(DType dtype) { return static_cast<ScalarType>(dtype); }

template <int N>
kernels::ElementwiseArgs<N> elementwise_args(const Shape& shape,
                                             const std::array<const Tensor*, N>& operands) {
  std::vector<std::vector<int64_t>> strides;
  strides.reserve(N);
  for (const Tensor* t : operands) strides.push_back(broadcast_strides(*t, shape));
  const CoalescedDims dims = coalesce_dims(shape, strides);
  LOCKSTEP_CHECK(dims.sizes.size() <= static_cast<size_t>(kernels::kMaxDims),
                 "CUDA kernel: shape {} with these strides needs {} dimensions after merging; at "
                 "most {} are supported (make the operands contiguous first)",
                 shape_str(shape), dims.sizes.size(), kernels::kMaxDims);
  kernels::ElementwiseArgs<N> args;
  args.ndim = static_cast<int>(dims.sizes.size());
  args.numel = shape_numel(shape);
  bool dense = args.ndim <= 1;
  for (int d = 0; d < args.ndim; ++d) args.sizes[d] = dims.sizes[d];
  for (int k = 0; k < N; ++k) {
    args.data[k] = operands[k]->raw_data();
    args.dtype[k] = scalar_type(operands[k]->dtype());
    for (int d = 0; d < args.ndim; ++d) args.strides[k][d] = dims.strides[k][d];
    if (args.ndim == 1 && dims.strides[k][0] != 1) dense = false;
  }
  args.contiguous = dense;
  return args;
}

template kernels::ElementwiseArgs<1> elementwise_args<1>(const Shape&,
                                                         const std::array<const Tensor*, 1>&);
template kernels::ElementwiseArgs<2> elementwise_args<2>(const Shape&,
                                                         const std::array<const Tensor*, 2>&);
template kernels::ElementwiseArgs<3> elementwise_args<3>(const Shape&,
                                                         const std::array<const Tensor*, 3>&);
template kernels::ElementwiseArgs<4> elementwise_args<4>(const Shape&,
                                                         const std::array<const Tensor*, 4>&);

cudaStream_t stream_of(const Tensor& t) {
  LOCKSTEP_CHECK(t.device().is_cuda(), "stream_of: tensor is on {}, not a CUDA device",
                 t.device().str());
  return current_stream(t.device().index).handle;
}

void check_device(std::string_view op, Device device, std::initializer_list<const Tensor*> tensors) {
  int i = 0;
  for (const Tensor* t : tensors) {
    if (t != nullptr && t->defined())
      LOCKSTEP_CHECK(t->device() == device,
                     "{}: operand {} is on {} but the op runs on {}; move it with "
                     ".to(Device::parse(\"{}\"))",
                     op, i, t->device().str(), device.str(), device.str());
    ++i;
  }
}

}  // namespace lockstep::runtime::cuda
