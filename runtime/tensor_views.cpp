// Views (shared storage, new shape/strides) and copies, all differentiable.
#include <algorithm>
#include <numeric>

#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

namespace {

Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  return Tensor(std::make_shared<TensorImpl>(
      base.storage(), std::move(shape), std::move(strides), offset, base.dtype()));
}

// Replaces one -1 in `shape` by the size that makes numel match.
Shape infer_shape(const Shape& shape, int64_t numel) {
  Shape out = shape;
  int64_t infer_at = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      LOCKSTEP_CHECK(infer_at < 0, "view/reshape {}: only one dimension can be -1", shape_str(shape));
      infer_at = static_cast<int64_t>(i);
    } else {
      LOCKSTEP_CHECK(out[i] >= 0, "view/reshape {}: invalid size {}", shape_str(shape), out[i]);
    }
  }
  if (infer_at >= 0) {
    Shape known_dims = out;
    known_dims[static_cast<size_t>(infer_at)] = 1;
    const int64_t known = shape_numel(known_dims);  // refuses a product that overflows
    LOCKSTEP_CHECK(known != 0 && numel % known == 0,
                   "view/reshape: shape {} is invalid for a tensor of {} elements",
                   shape_str(shape), numel);
    out[infer_at] = numel / known;
  }
  LOCKSTEP_CHECK(shape_numel(out) == numel,
                 "view/reshape: shape {} is invalid for a tensor of {} elements", shape_str(shape),
                 numel);
  return out;
}

// Strides that let `old` (shape, strides) be viewed as `shape` without a copy,
// or an empty optional-like result when impossible. Same rule as ATen's
// computeStride: each run of old dims that is contiguous in memory may be
// split or merged freely.
bool view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& shape,
                  Shape& strides) {
  strides.assign(shape.size(), 0);
  if (shape_numel(old_shape) == 0) {
    strides = contiguous_strides(shape);
    return true;
  }
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    if (d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  while (view_d >= 0) strides[view_d--] = 1;  // trailing size-1 dims
  return true;
}

Tensor reshape_backward(const BackwardArgs& a, const Shape& in_shape) {
  return a.grad.reshape(in_shape);
}

}  // namespace

Tensor Tensor::view(const Shape& new_shape) const {
  Shape shape = infer_shape(new_shape, numel());
  Shape st;
  LOCKSTEP_CHECK(view_strides(this->shape(), strides(), shape, st),
                 "view {}: the tensor's strides {} do not allow it without a copy; use "
                 "reshape() (which copies) or call contiguous() first",
                 shape_str(shape), shape_str(strides()));
  Shape in_shape = this->shape();
  return record(make_view(*this, shape, st, storage_offset()), "ViewBackward", {*this}, {},
                [in_shape](const BackwardArgs& a) {
                  return std::vector<Tensor>{reshape_backward(a, in_shape)};
                });
}

Tensor Tensor::reshape(const Shape& new_shape) const {
  Shape shape = infer_shape(new_shape, numel());
  Shape st;
  if (view_strides(this->shape(), strides(), shape, st)) return view(shape);
  return contiguous().view(shape);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  LOCKSTEP_CHECK(static_cast<int64_t>(dims.size()) == dim(),
                 "permute: got {} dims for a tensor with {}", dims.size(), dim());
  Shape shape(dims.size()), st(dims.size());
  std::vector<int64_t> inverse(dims.size(), -1);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], dim());
    LOCKSTEP_CHECK(inverse[d] < 0, "permute: dim {} repeated in [{}]", d, fmt::join(dims, ", "));
    inverse[d] = static_cast<int64_t>(i);
    shape[i] = this->shape()[d];
    st[i] = strides()[d];
  }
  return record(make_view(*this, shape, st, storage_offset()), "PermuteBackward", {*this}, {},
                [inverse](const BackwardArgs& a) {
                  return std::vector<Tensor>{a.grad.permute(inverse)};
                });
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  if (dim() == 0) {  // as PyTorch: dims 0 and -1 of a scalar, and a view of it
    wrap_dim(d0, 0);
    wrap_dim(d1, 0);
    return permute({});
  }
  std::vector<int64_t> dims(dim());
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[wrap_dim(d0, dim())], dims[wrap_dim(d1, dim())]);
  return permute(dims);
}

Tensor Tensor::t() const {
  LOCKSTEP_CHECK(dim() <= 2, "t(): expects a tensor with at most 2 dims, got shape {}; use "
                 "transpose(d0, d1)", shape_str(shape()));
  return transpose(0, dim() < 2 ? 0 : 1);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  LOCKSTEP_CHECK(dim() > 0, "slice: cannot slice a 0-d tensor (it has no dimensions)");
  d = wrap_dim(d, dim());
  LOCKSTEP_CHECK(step > 0, "slice: step must be positive, got {}", step);
  const int64_t n = shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  // A step beyond the size leaves one element (or none), whose stride does
  // not matter: clamped, the arithmetic below cannot overflow.
  const int64_t stride_step = std::min(step, std::max<int64_t>(n, 1));
  Shape shape = this->shape(), st = strides();
  shape[d] = (end - start + stride_step - 1) / stride_step;
  st[d] *= stride_step;
  Shape in_shape = this->shape();
  DType dt = dtype();
  Device dev = device();
  return record(make_view(*this, shape, st, storage_offset() + start * strides()[d]),
                "SliceBackward", {*this}, {},
                [=](const BackwardArgs& a) {
                  // On the input's device: a CPU buffer here would send a host
                  // gradient into the device graph (the next gemm then reads
                  // device pointers on the host).
                  Tensor g = Tensor::zeros(in_shape, dt, dev);
                  g.slice(d, start, end, step).copy_(a.grad);
                  return std::vector<Tensor>{g};
                });
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  LOCKSTEP_CHECK(dim() > 0, "select: cannot select from a 0-d tensor (it has no dimensions)");
  d = wrap_dim(d, dim());
  const int64_t n = shape()[d];
  LOCKSTEP_CHECK(index >= -n && index < n, "select: index {} out of range for dim {} of size {}",
                 index, d, n);
  if (index < 0) index += n;
  return slice(d, index, index + 1).squeeze(d);
}

Tensor Tensor::expand(const Shape& new_shape) const {
  LOCKSTEP_CHECK(static_cast<int64_t>(new_shape.size()) >= dim(),
                 "expand: target {} has fewer dims than the tensor's shape {}",
                 shape_str(new_shape), shape_str(shape()));
  const size_t lead = new_shape.size() - shape().size();
  Shape shape(new_shape.size()), st(new_shape.size(), 0);
  for (size_t i = 0; i < new_shape.size(); ++i) {
    if (i < lead) {
      LOCKSTEP_CHECK(new_shape[i] >= 0, "expand: size -1 not allowed for a new leading dim");
      shape[i] = new_shape[i];
      continue;
    }
    int64_t have = this->shape()[i - lead];
    int64_t want = new_shape[i] == -1 ? have : new_shape[i];
    LOCKSTEP_CHECK(want >= 0 && (have == want || have == 1),
                   "expand: cannot expand shape {} to {}",
                   shape_str(this->shape()), shape_str(new_shape));
    shape[i] = want;
    st[i] = have == want ? strides()[i - lead] : 0;
  }
  Shape in_shape = this->shape();
  return record(make_view(*this, shape, st, storage_offset()), "ExpandBackward", {*this}, {},
                [in_shape](const BackwardArgs& a) {
                  return std::vector<Tensor>{sum_to(a.grad, in_shape)};
                });
}

Tensor Tensor::unsqueeze(int64_t d) const {
  // Checked here: wrap_dim would name the result's dims as the tensor's.
  LOCKSTEP_CHECK(d >= -dim() - 1 && d <= dim(),
                 "unsqueeze: dim {} is out of range for a tensor with {} dims (expected {}..{})",
                 d, dim(), -dim() - 1, dim());
  d = wrap_dim(d, dim() + 1);
  Shape shape = this->shape();
  shape.insert(shape.begin() + d, 1);
  return view(shape);
}

Tensor Tensor::squeeze(int64_t d) const {
  d = wrap_dim(d, dim());
  // A scalar, or a dim not of size 1, keeps its shape; as PyTorch, the result
  // is still a view, never the tensor itself (whose requires_grad or .grad a
  // caller might then change unknowingly).
  Shape shape = this->shape(), st = strides();
  if (dim() > 0 && shape[d] == 1) {
    shape.erase(shape.begin() + d);
    st.erase(st.begin() + d);
  }
  Shape in_shape = this->shape();
  return record(make_view(*this, shape, st, storage_offset()), "SqueezeBackward", {*this}, {},
                [in_shape](const BackwardArgs& a) {
                  return std::vector<Tensor>{reshape_backward(a, in_shape)};
                });
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  start_dim = wrap_dim(start_dim, dim());  // a 0-d tensor's are 0 and -1, as PyTorch
  end_dim = wrap_dim(end_dim, dim());
  if (dim() == 0) return reshape({1});
  LOCKSTEP_CHECK(start_dim <= end_dim, "flatten: start_dim {} after end_dim {}", start_dim, end_dim);
  Shape shape(this->shape().begin(), this->shape().begin() + start_dim);
  int64_t n = 1;
  for (int64_t d = start_dim; d <= end_dim; ++d) n *= this->shape()[d];
  shape.push_back(n);
  shape.insert(shape.end(), this->shape().begin() + end_dim + 1, this->shape().end());
  return reshape(shape);
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = Tensor::empty(shape(), dtype(), device());
  {
    NoGradGuard no_grad;
    out.copy_(*this);
  }
  return record(out, "CloneBackward", {*this}, {},
                [](const BackwardArgs& a) { return std::vector<Tensor>{a.grad}; });
}

Tensor Tensor::to(DType dt) const {
  if (dt == dtype()) return *this;
  Tensor out = Tensor::empty(shape(), dt, device());
  {
    NoGradGuard no_grad;
    out.copy_(*this);
  }
  if (!is_floating(dt)) return out;  // integer results carry no gradient
  DType in_dt = dtype();
  return record(out, "ToDTypeBackward", {*this}, {},
                [in_dt](const BackwardArgs& a) { return std::vector<Tensor>{a.grad.to(in_dt)}; });
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  Tensor out = Tensor::empty(shape(), dtype(), d);  // throws for devices without storage
  {
    NoGradGuard no_grad;
    out.copy_(*this);
  }
  if (!is_floating(dtype())) return out;
  const Device from = device();
  return record(out, "ToDeviceBackward", {*this}, {},
                [from](const BackwardArgs& a) { return std::vector<Tensor>{a.grad.to(from)}; });
}

}  // namespace lockstep::runtime
