// Reductions: sum and mean over dims (accumulating in double for floats on
// the CPU; the device backend's kernels elsewhere), max and argmax. Autograd
// is recorded here, once per op, for every device.
#include "lockstep/runtime/ops/reduce.h"

#include <algorithm>
#include <limits>

#include <fmt/ranges.h>

#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/device_backend.h"
#include "lockstep/runtime/ops/detail/convert.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/detail/strided_loop.h"

namespace lockstep::runtime {

namespace {

// Sorted, wrapped dims; empty `dims` means all. A dim named twice (1 and -1
// of a 2-d tensor) is refused, as PyTorch does: reducing it "twice" has no
// meaning, and counting it once would hide the caller's mistake.
std::vector<int64_t> normalize_dims(const std::vector<int64_t>& dims, int64_t ndim,
                                    const char* name) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < ndim; ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) out.push_back(wrap_dim(d, ndim));
  std::sort(out.begin(), out.end());
  const auto repeated = std::adjacent_find(out.begin(), out.end());
  LOCKSTEP_CHECK(repeated == out.end(),
                 "{}: dim {} appears more than once in dims [{}] of a {}-d tensor; list each dim "
                 "once",
                 name, *repeated, fmt::join(dims, ", "), ndim);
  if (ndim == 0) return {};  // a 0-dim tensor accepts dim 0 or -1: nothing to reduce
  return out;
}

Shape kept_shape(const Shape& shape, const std::vector<int64_t>& dims) {
  Shape out = shape;
  for (int64_t d : dims) out[d] = 1;
  return out;
}

Shape dropped_shape(const Shape& shape, const std::vector<int64_t>& dims) {
  Shape out;
  for (size_t i = 0; i < shape.size(); ++i)
    if (!std::binary_search(dims.begin(), dims.end(), static_cast<int64_t>(i))) out.push_back(shape[i]);
  return out;
}

// x[0] + ... + x[n-1] in Acc, four partial sums at a time: one running sum
// waits on each add.
template <class Acc, class T>
Acc contiguous_sum(const T* __restrict x, int64_t n) {
  Acc s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int u = 0; u < 4; ++u) s[u] += static_cast<Acc>(x[i + u]);
  for (; i < n; ++i) s[0] += static_cast<Acc>(x[i]);
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// Sum of `a` over `dims` (keepdim shape), in accumulator type Acc, as dtype `out_dtype`.
template <class T, class Acc>
Tensor sum_kernel(const Tensor& a, const Shape& keep, DType acc_dtype) {
  Tensor acc = Tensor::zeros(keep, acc_dtype);
  Acc* o = acc.data_ptr<Acc>();
  const T* x = static_cast<const T*>(a.storage()->data()) + a.storage_offset();
  detail::strided_loop<2>(
      a.shape(), {detail::broadcast_strides(acc, a.shape()), a.strides()},
      [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
        const T* xp = x + off[1];
        if (st[0] == 0) {  // reducing along the inner row: keep register accumulators
          if (st[1] == 1) {
            o[off[0]] += contiguous_sum<Acc>(xp, n);
          } else {
            Acc s = 0;
            for (int64_t i = 0; i < n; ++i) s += static_cast<Acc>(xp[i * st[1]]);
            o[off[0]] += s;
          }
        } else if (st[0] == 1 && st[1] == 1) {  // a whole row into a row (a bias's gradient)
          Acc* __restrict op = o + off[0];
          for (int64_t i = 0; i < n; ++i) op[i] += static_cast<Acc>(xp[i]);
        } else {
          Acc* op = o + off[0];
          for (int64_t i = 0; i < n; ++i) op[i * st[0]] += static_cast<Acc>(xp[i * st[1]]);
        }
      });
  return acc;
}

// scale * sum (mean on CUDA scales in the kernel: one rounding for bf16/f16).
Tensor sum_impl(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim,
                double scale = 1.0) {
  Shape keep = kept_shape(a.shape(), dims);
  Tensor acc;
  DType out_dtype = is_floating(a.dtype()) ? a.dtype() : DType::i64;
  if (!a.device().is_cpu()) {
    Tensor out = device_backend(a.device()).sum(a, dims, scale, out_dtype);
    return keepdim ? out : out.reshape(dropped_shape(a.shape(), dims));
  }
  if (is_floating(a.dtype())) {
    Tensor x = a.dtype() == DType::f32 || a.dtype() == DType::f64 ? a : a.to(DType::f32);
    acc = dispatch_float(x.dtype(), "sum", [&](auto tag) {
      return sum_kernel<decltype(tag), double>(x, keep, DType::f64);
    });
  } else {
    Tensor x = a.to(DType::i64);
    acc = sum_kernel<int64_t, int64_t>(x, keep, DType::i64);
  }
  if (scale != 1.0) acc.mul_(scale);
  Tensor out = acc.to(out_dtype);
  return keepdim ? out : out.reshape(dropped_shape(a.shape(), dims));
}

// max over the last dim of a contiguous [rows, n] view: values and first argmax.
template <class T>
void max_rows(const T* x, int64_t rows, int64_t n, T* values, int64_t* indices) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * n;
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i)
      if (row[i] > row[best] || (row[i] != row[i] && row[best] == row[best])) best = i;  // NaN wins
    if (values) values[r] = row[best];
    indices[r] = best;
  }
}

struct MaxResult {
  Tensor values;   // shape without `dim`
  Tensor indices;  // i64, same shape
};

MaxResult max_impl(const Tensor& a, int64_t dim, bool want_values) {
  dim = wrap_dim(dim, a.dim());
  const int64_t n = a.dim() == 0 ? 1 : a.shape()[dim];
  LOCKSTEP_CHECK(n > 0, "max/argmax over an empty dimension {} of shape {}", dim,
                 shape_str(a.shape()));
  // Move `dim` last, keeping the other dims in order: rows come out in the
  // order of the result's shape.
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (d != dim) perm.push_back(d);
  if (a.dim() > 0) perm.push_back(dim);
  if (!a.device().is_cpu()) {
    ValuesAndIndices m = device_backend(a.device()).max_along(a, dim, want_values);
    return {m.values, m.indices};
  }
  if (is_reduced_float(a.dtype())) {  // widening is exact, so is narrowing the maxima back
    MaxResult r = max_impl(a.detach().to(DType::f32), dim, want_values);
    if (want_values) r.values = r.values.to(a.dtype());
    return r;
  }
  Tensor moved = a.dim() == 0 ? a.reshape({1}) : a.permute(perm).contiguous();
  Shape out_shape = a.dim() == 0 ? Shape{} : dropped_shape(a.shape(), {dim});
  const int64_t rows = shape_numel(out_shape);
  MaxResult r;
  r.indices = Tensor::empty(out_shape, DType::i64);
  if (want_values) r.values = Tensor::empty(out_shape, a.dtype());
  const auto rows_of = [&](auto tag) {
    using T = decltype(tag);
    max_rows<T>(moved.data_ptr<T>(), rows, n, want_values ? r.values.data_ptr<T>() : nullptr,
                r.indices.data_ptr<int64_t>());
  };
  // u8 and bool compare as what they are (unsigned bytes, false < true), as
  // PyTorch's max and argmax of them.
  if (a.dtype() == DType::u8) {
    rows_of(uint8_t{});
  } else if (a.dtype() == DType::boolean) {
    rows_of(bool{});
  } else {
    dispatch_arith(a.dtype(), "max", rows_of);
  }
  return r;
}

}  // namespace

Tensor sum(const Tensor& a) { return sum(a, {}, false); }

Tensor sum(const Tensor& a, const std::vector<int64_t>& dims_in, bool keepdim) {
  if (auto c = detail::autocast_inputs(detail::CastPolicy::f32, {a})) return sum((*c)[0], dims_in, keepdim);
  std::vector<int64_t> dims = normalize_dims(dims_in, a.dim(), "sum");
  Tensor out = sum_impl(a, dims, keepdim);
  Shape in_shape = a.shape(), keep = kept_shape(a.shape(), dims);
  return record(out, "SumBackward", {a}, {}, [in_shape, keep](const BackwardArgs& g) {
    return std::vector<Tensor>{g.grad.reshape(keep).expand(in_shape)};
  });
}

Tensor mean(const Tensor& a) { return mean(a, {}, false); }

Tensor mean(const Tensor& a, const std::vector<int64_t>& dims_in, bool keepdim) {
  if (auto c = detail::autocast_inputs(detail::CastPolicy::f32, {a}))
    return mean((*c)[0], dims_in, keepdim);
  LOCKSTEP_CHECK(is_floating(a.dtype()), "mean: needs a floating tensor, got {}",
                 dtype_name(a.dtype()));
  std::vector<int64_t> dims = normalize_dims(dims_in, a.dim(), "mean");
  int64_t count = 1;
  for (int64_t d : dims) count *= a.shape()[d];
  const double scale = 1.0 / static_cast<double>(count);
  // Scaled inside the sum, before its one rounding: a bf16/f16 sum rounded
  // first would lose bits and overflow (the mean of 70000 f16 ones was inf).
  Tensor out = sum_impl(a, dims, keepdim, scale);
  Shape in_shape = a.shape(), keep = kept_shape(a.shape(), dims);
  return record(out, "MeanBackward", {a}, {}, [in_shape, keep, scale](const BackwardArgs& g) {
    return std::vector<Tensor>{mul(g.grad, scale).reshape(keep).expand(in_shape)};
  });
}

Tensor max(const Tensor& a, int64_t dim, bool keepdim) {
  MaxResult r = max_impl(a, dim, true);
  int64_t d = a.dim() == 0 ? 0 : wrap_dim(dim, a.dim());
  Shape in_shape = a.shape();
  Tensor values = keepdim && a.dim() > 0 ? r.values.unsqueeze(d) : r.values;
  DType dt = a.dtype();
  // The indices are saved, not captured: backward frees them (and a second
  // backward without retain_graph is an error), as PyTorch's saved indices.
  return record(values, "MaxBackward", {a}, {r.indices}, [=](const BackwardArgs& g) {
    const Tensor& idx = g.saved[0];
    // Scatter each gradient to the position of its maximum.
    Tensor gv = keepdim && !in_shape.empty() ? g.grad.squeeze(d) : g.grad;
    if (!idx.device().is_cpu())
      return std::vector<Tensor>{device_backend(idx.device()).max_backward(gv, idx, in_shape, d, dt)};
    Tensor grad = Tensor::zeros(in_shape, dt);
    gv = gv.contiguous().to(dt);
    const int64_t* ip = idx.data_ptr<int64_t>();
    const int64_t n = in_shape.empty() ? 1 : in_shape[d];
    int64_t inner = 1;
    for (size_t i = d + 1; i < in_shape.size(); ++i) inner *= in_shape[i];
    const int64_t outer = idx.numel() / std::max<int64_t>(inner, 1);
    dispatch_floating(dt, "max backward", [&](auto tag) {
      using T = decltype(tag);
      T* gp = grad.data_ptr<T>();
      const T* vp = gv.data_ptr<T>();
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i) {
          int64_t k = o * inner + i;
          gp[(o * n + ip[k]) * inner + i] = vp[k];
        }
    });
    return std::vector<Tensor>{grad};
  });
}

Tensor max(const Tensor& a) {
  Tensor value;
  {
    NoGradGuard no_grad;
    value = max(a.reshape({-1}), 0, false);
  }
  // Every element equal to the maximum (every NaN, when it is NaN) is the
  // maximum, so they share its gradient evenly, as PyTorch's
  // evenly_distribute_backward shares it.
  return record(value, "MaxBackward", {a}, {a, value}, [](const BackwardArgs& g) {
    const Tensor &x = g.saved[0], &v = g.saved[1];
    const DType dt = x.dtype();
    const auto is_nan = [dt](const Tensor& t) { return add(neg(eq(t, t).to(dt)), 1.0); };
    // eq is false wherever a NaN is, so the two terms never overlap.
    const Tensor mask = add(eq(x, v).to(dt), mul(is_nan(x), is_nan(v)));
    return std::vector<Tensor>{mul(mask, div(g.grad.to(dt), sum(mask)))};
  });
}

Tensor argmax(const Tensor& a, int64_t dim, bool keepdim) {
  MaxResult r = max_impl(a, dim, false);
  return keepdim && a.dim() > 0 ? r.indices.unsqueeze(wrap_dim(dim, a.dim())) : r.indices;
}

}  // namespace lockstep::runtime
