#include "lockstep/runtime/cuda/ops/reduce.h"

#include <algorithm>
#include <utility>

#include "lockstep/runtime/cuda/core/coalesce_dims.h"
#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/device_guard.h"
#include "lockstep/runtime/cuda/kernels/reduce.h"
#include "lockstep/runtime/cuda/tensor_args.h"

namespace lockstep::runtime::cuda {

namespace {

using SizeStride = std::pair<int64_t, int64_t>;

// Merges one group of dims into (sizes, strides); returns how many remain.
int merge_group(const std::vector<SizeStride>& dims, int64_t* sizes, int64_t* strides,
                const Tensor& a, const char* op) {
  std::vector<int64_t> sz, st;
  for (const auto& [size, stride] : dims) sz.push_back(size), st.push_back(stride);
  const CoalescedDims c = coalesce_dims(sz, {st});
  LOCKSTEP_CHECK(c.sizes.size() <= static_cast<size_t>(kernels::kMaxDims),
                 "{}: an input of shape {} with these strides needs {} dimensions after "
                 "merging; at most {} are supported (make it contiguous first)",
                 op, shape_str(a.shape()), c.sizes.size(), kernels::kMaxDims);
  for (size_t i = 0; i < c.sizes.size(); ++i) sizes[i] = c.sizes[i], strides[i] = c.strides[0][i];
  return static_cast<int>(c.sizes.size());
}

// `a` seen as (kept dims in order, reduced dims). Sums may take the reduced
// dims in any order: the smallest stride goes innermost, where the kernels
// read contiguously.
kernels::ReduceArgs reduce_args(const Tensor& a, const std::vector<int64_t>& dims,
                                bool any_order, const char* op) {
  std::vector<SizeStride> kept, reduced;
  for (int64_t d = 0; d < a.dim(); ++d) {
    const SizeStride ss{a.shape()[d], a.strides()[d]};
    (std::binary_search(dims.begin(), dims.end(), d) ? reduced : kept).push_back(ss);
  }
  if (any_order)
    std::stable_sort(reduced.begin(), reduced.end(),
                     [](const SizeStride& x, const SizeStride& y) { return x.second > y.second; });
  kernels::ReduceArgs args;
  args.in = a.raw_data();
  args.in_dtype = scalar_type(a.dtype());
  args.num_outputs = 1;
  for (const auto& ss : kept) args.num_outputs *= ss.first;
  args.reduce_size = 1;
  for (const auto& ss : reduced) args.reduce_size *= ss.first;
  args.kept_ndim = merge_group(kept, args.kept_sizes, args.kept_strides, a, op);
  args.reduce_ndim = merge_group(reduced, args.reduce_sizes, args.reduce_strides, a, op);
  return args;
}

void run(kernels::ReduceOp op, const kernels::ReduceArgs& args, const Tensor& a, double scale) {
  DeviceGuard guard(a.device().index);
  const kernels::ReducePlan plan = kernels::plan_reduce(op, args, a.device().index);
  // Freed below while the kernels may still run: the caching allocator hands
  // the block out again only to work queued later on this stream.
  Tensor workspace;
  if (plan.workspace_bytes > 0)
    workspace = Tensor::empty({static_cast<int64_t>(plan.workspace_bytes)}, DType::u8, a.device());
  LOCKSTEP_CUDA_CHECK(kernels::reduce(op, args, plan, scale,
                                      workspace.defined() ? workspace.raw_data() : nullptr,
                                      stream_of(a)));
}

}  // namespace

Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, double scale, DType out_dtype) {
  Shape keep = a.shape();
  for (int64_t d : dims) keep[d] = 1;
  Tensor out = Tensor::empty(keep, out_dtype, a.device());
  if (out.numel() == 0) return out;
  kernels::ReduceArgs args = reduce_args(a, dims, /*any_order=*/true, "sum");
  args.out = out.raw_data();
  args.out_dtype = scalar_type(out_dtype);
  run(kernels::ReduceOp::sum, args, a, scale);
  return out;
}

MaxAlong max_along(const Tensor& a_in, int64_t dim, bool want_values) {
  const DType dt = a_in.dtype();
  LOCKSTEP_CHECK(is_floating(dt) || dt == DType::i32 || dt == DType::i64,
                 "max/argmax: dtype {} is not supported on CUDA; use f32, f64, bf16, f16, i32 or "
                 "i64",
                 dtype_name(dt));
  const Tensor a = a_in.dim() == 0 ? a_in.reshape({1}) : a_in;
  if (a_in.dim() == 0) dim = 0;
  Shape out_shape;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (d != dim) out_shape.push_back(a.shape()[d]);
  MaxAlong r;
  r.indices = Tensor::empty(out_shape, DType::i64, a.device());
  if (want_values) r.values = Tensor::empty(out_shape, dt, a.device());
  if (r.indices.numel() == 0) return r;
  kernels::ReduceArgs args = reduce_args(a, {dim}, /*any_order=*/false, "max");
  args.out = want_values ? r.values.raw_data() : nullptr;
  args.out_dtype = scalar_type(dt);
  args.out_index = r.indices.data_ptr<int64_t>();
  run(kernels::ReduceOp::max, args, a, 1.0);
  return r;
}

Tensor max_backward(const Tensor& grad, const Tensor& indices, const Shape& in_shape,
                    int64_t dim, DType dtype) {
  LOCKSTEP_CHECK(is_floating(dtype), "max backward: dtype {} has no gradient", dtype_name(dtype));
  check_device("max backward", indices.device(), {&grad});
  const Tensor g = grad.to(dtype).contiguous();
  const Tensor idx = indices.contiguous();
  int64_t outer = 1, n = 1, inner = 1;
  for (int64_t d = 0; d < static_cast<int64_t>(in_shape.size()); ++d)
    (d < dim ? outer : d == dim ? n : inner) *= in_shape[d];
  Tensor out = Tensor::empty(in_shape, dtype, indices.device());
  DeviceGuard guard(out.device().index);
  LOCKSTEP_CUDA_CHECK(kernels::max_backward(scalar_type(dtype), g.raw_data(),
                                            idx.data_ptr<int64_t>(), out.raw_data(), outer, n,
                                            inner, stream_of(out)));
  return out;
}

}  // namespace lockstep::runtime::cuda
