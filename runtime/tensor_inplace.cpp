// In-place writes: copy_, fill_, zero_, add_, mul_. Each bumps the storage's
// version so that autograd notices a change to a tensor saved for backward.
#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/device_backend.h"
#include "lockstep/runtime/ops/detail/convert.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/detail/strided_loop.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

namespace {

// The first and last element offsets `t` covers when its elements fill that
// range exactly once (a dense layout, in any order of dims); nullopt for a
// strided or empty view.
std::optional<std::pair<int64_t, int64_t>> dense_span(const Tensor& t) {
  if (t.numel() == 0) return std::nullopt;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims of size > 1
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.shape()[d] > 1) dims.emplace_back(t.strides()[d], t.shape()[d]);
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return std::nullopt;
    expected *= size;
  }
  return std::pair{t.storage_offset(), t.storage_offset() + t.numel() - 1};
}

// The first and last element offsets of a non-empty `t` (strides are never negative).
std::pair<int64_t, int64_t> extent(const Tensor& t) {
  int64_t last = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.shape()[d] - 1) * t.strides()[d];
  return {t.storage_offset(), last};
}

// Calls fn(offset) for the storage offset of each element of `t`.
template <class F>
void for_each_offset(const Tensor& t, F fn) {
  detail::strided_loop<1>(t.shape(), {t.strides()},
                          [&](const std::array<int64_t, 1>& off, int64_t n,
                              const std::array<int64_t, 1>& st) {
                            for (int64_t i = 0; i < n; ++i)
                              fn(t.storage_offset() + off[0] + i * st[0]);
                          });
}

// Whether views `a` and `b` of one storage have an element in common. Dense
// views compare their spans; otherwise, where their extents meet, the sorted
// offsets of the smaller view are looked up for each offset of the other:
// strided views whose rows interleave (the two halves of each row) share
// nothing, while a view shifted by a column (x[:, 1:] and x[:, :-1]) does.
bool share_elements(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const auto da = dense_span(a), db = dense_span(b);
  if (da && db) return !(da->second < db->first || db->second < da->first);
  const auto [a_first, a_last] = extent(a);
  const auto [b_first, b_last] = extent(b);
  const int64_t lo = std::max(a_first, b_first), hi = std::min(a_last, b_last);
  if (lo > hi) return false;
  const bool a_smaller = a.numel() <= b.numel();
  const Tensor& small = a_smaller ? a : b;
  const Tensor& large = a_smaller ? b : a;
  std::vector<int64_t> offsets;
  for_each_offset(small, [&](int64_t o) {
    if (o >= lo && o <= hi) offsets.push_back(o);
  });
  std::sort(offsets.begin(), offsets.end());
  bool shared = false;
  for_each_offset(large, [&](int64_t o) {
    shared = shared ||
             (o >= lo && o <= hi && std::binary_search(offsets.begin(), offsets.end(), o));
  });
  return shared;
}

// Whether `a` and `b` are views of the same elements in the same layout.
bool same_view(const Tensor& a, const Tensor& b) {
  return a.storage() == b.storage() && a.storage_offset() == b.storage_offset() &&
         a.shape() == b.shape() && a.strides() == b.strides();
}

// add_ and mul_ run on the tensor's device: a CPU tensor's loop cannot read
// a device operand (copy_ moves between devices; they do not).
void check_operand_device(const Tensor& t, const Tensor& other, const char* op) {
  LOCKSTEP_CHECK(!t.device().is_cpu() || other.device().is_cpu(),
                 "{}: the operand is on {} and the tensor on the CPU; move it with .to()", op,
                 other.device().str());
}

// What every in-place write checks first: autograd can follow it, every
// element written has a memory location of its own (not an expanded
// tensor), and the source does not share memory with it in part, where the
// loop would read elements it has already overwritten (PyTorch refuses the
// same). A source with the very same layout (x.add_(x)) is fine.
void check_inplace(const Tensor& t, const char* op, const Tensor* src = nullptr) {
  LOCKSTEP_CHECK(!(grad_enabled() && t.requires_grad()),
                 "{}: in-place change of a tensor that requires grad (shape {}) while grad mode "
                 "is on; autograd cannot track it. Do it under NoGradGuard (as optimizers do) or "
                 "use the out-of-place op.",
                 op, shape_str(t.shape()));
  for (int64_t d = 0; d < t.dim(); ++d) {
    LOCKSTEP_CHECK(t.strides()[d] != 0 || t.shape()[d] <= 1,
                   "{}: the tensor written to (shape {}, strides {}) has several elements at one "
                   "memory location (an expanded tensor); write to a .clone() of it",
                   op, shape_str(t.shape()), shape_str(t.strides()));
  }
  if (src == nullptr) return;
  LOCKSTEP_CHECK(!(grad_enabled() && src->requires_grad()),
                 "{}: the source (shape {}) requires grad, but an in-place write cannot record "
                 "it for autograd, so its gradient through this op would be lost; use the "
                 "out-of-place op (b = b + w), or .detach() the source if no gradient should "
                 "flow",
                 op, shape_str(src->shape()));
  if (src->storage() != t.storage() || same_view(*src, t)) return;
  LOCKSTEP_CHECK(!share_elements(t, *src),
                 "{}: the source (shape {}) and the tensor written to (shape {}) share part of "
                 "their memory, so the result would depend on the order of the writes; read "
                 "from a .clone() of the source",
                 op, shape_str(src->shape()), shape_str(t.shape()));
}

// Converting NaN, an infinity or 1e10 into an i32 is undefined (it gave
// INT32_MIN), and 70000 into an f16 gives an infinity, so such a fill is
// refused, as PyTorch's checked conversion of a scalar refuses it. A fraction
// is truncated toward zero, as there.
void check_fill_value(DType dtype, double value) {
  LOCKSTEP_CHECK(holds_value(dtype, value),
                 "fill_: the value {} does not fit in dtype {}; fill a {} tensor instead", value,
                 dtype_name(dtype), is_floating(dtype) ? "wider floating (f32, f64)" : "floating");
}

// An integer tensor cannot hold a floating result. PyTorch refuses
// i64.mul_(0.5), i64.add_(x, 0.5) and i64.add_(an f32 tensor) rather than
// truncate them; so do we. `scalar` is the factor or alpha.
void check_integral_result(const Tensor& t, const char* op, DType operand, double scalar) {
  if (is_floating(t.dtype())) return;
  // Only a bool result fits a bool tensor (PyTorch refuses the rest too).
  LOCKSTEP_CHECK(t.dtype() != DType::boolean || operand == DType::boolean,
                 "{}: the result of a {} operand cannot be written into a bool tensor; convert "
                 "the tensor with .to(DType::{}) first",
                 op, dtype_name(operand), dtype_name(operand));
  LOCKSTEP_CHECK(!is_floating(operand),
                 "{}: the result of a {} operand cannot be written into a {} tensor without "
                 "truncating it; convert the tensor to a floating dtype with .to() first",
                 op, dtype_name(operand), dtype_name(t.dtype()));
  LOCKSTEP_CHECK(std::isfinite(scalar) && std::trunc(scalar) == scalar,
                 "{}: {} is not a whole number, so a {} tensor cannot hold the result without "
                 "truncating it; convert the tensor to a floating dtype with .to() first",
                 op, scalar, dtype_name(t.dtype()));
  // Converted to the tensor's dtype, an alpha past its range is undefined
  // (1e10 gave INT32_MIN in an i32, 1e30 INT64_MIN in an i64).
  LOCKSTEP_CHECK(holds_value(t.dtype(), scalar),
                 "{}: {} is out of range for a {} tensor's arithmetic; convert the tensor with "
                 ".to() first", op, scalar, dtype_name(t.dtype()));
}

// The device whose backend runs an in-place op: dst's, or src's for a copy_
// from a device into host memory. The CPU's loops below when both are there.
Device kernel_device(const Tensor& dst, const Tensor* src = nullptr) {
  return dst.device().is_cpu() && src != nullptr ? src->device() : dst.device();
}

// dst op= f(src) elementwise, src broadcast to dst's shape and of type S
// (operand_dtype's).
template <class T, class S = T, class F>
void apply_inplace(const Tensor& dst, const Tensor& src, F f) {
  T* d = static_cast<T*>(dst.storage()->data()) + dst.storage_offset();
  const S* s = static_cast<const S*>(src.storage()->data()) + src.storage_offset();
  detail::strided_loop<2>(
      dst.shape(), {dst.strides(), detail::broadcast_strides(src, dst.shape())},
      [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
        T* dp = d + off[0];
        const S* sp = s + off[1];
        if (st[0] == 1 && st[1] == 1) {
          for (int64_t i = 0; i < n; ++i) dp[i] = f(dp[i], sp[i]);
        } else if (st[0] == 1 && st[1] == 0) {
          const S v = *sp;
          for (int64_t i = 0; i < n; ++i) dp[i] = f(dp[i], v);
        } else {
          for (int64_t i = 0; i < n; ++i) dp[i * st[0]] = f(dp[i * st[0]], sp[i * st[1]]);
        }
      });
}

// The dtype an add_ or mul_ operand is read in: the tensor's own, but f32
// for a bf16 or f16 tensor and a wider floating operand (a scalar factor
// included), so the result is rounded to 16 bits once, as PyTorch computes
// in f32 then. Rounding the operand first too (a factor of 1/3 became
// 0.333984375 in bf16) made every product of a scale 0.2% too large.
DType operand_dtype(DType self, DType operand) {
  const bool wider = operand == DType::f32 || operand == DType::f64;
  return is_reduced_float(self) && wider ? DType::f32 : self;
}

// dst = f(dst, src) in compute_t<T> with src read in operand_dtype. u8
// computes in int and wraps modulo 256 as it is stored, and bool keeps
// whether the result is nonzero (add_ a logical or, mul_ a logical and), as
// PyTorch's arithmetic of them.
template <class F>
void combine_inplace(const Tensor& dst, const Tensor& other, const char* op, F f) {
  const DType read = operand_dtype(dst.dtype(), other.dtype());
  const Tensor src = other.to(read);
  if (dst.dtype() == DType::u8) {
    apply_inplace<uint8_t>(dst, src, [&](uint8_t x, uint8_t y) {
      return static_cast<uint8_t>(f(int{x}, int{y}));
    });
    return;
  }
  if (dst.dtype() == DType::boolean) {
    apply_inplace<bool>(dst, src, [&](bool x, bool y) { return f(int{x}, int{y}) != 0; });
    return;
  }
  dispatch_compute(dst.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    if constexpr (detail::is_half_v<T>) {
      if (read == DType::f32) {
        apply_inplace<T, float>(dst, src, [&](T x, float y) { return T(f(float(x), y)); });
        return;
      }
    }
    apply_inplace<T>(dst, src, [&](T x, T y) { return static_cast<T>(f(C(x), C(y))); });
  });
}

// Whether `src` broadcasts to exactly `dst` (without throwing, unlike broadcast_shapes).
bool broadcasts_to(const Shape& src, const Shape& dst) {
  if (src.size() > dst.size()) return false;
  const size_t lead = dst.size() - src.size();
  for (size_t i = 0; i < src.size(); ++i)
    if (src[i] != 1 && src[i] != dst[lead + i]) return false;
  return true;
}

}  // namespace

Tensor& Tensor::copy_(const Tensor& src) {
  check_inplace(*this, "copy_", &src);
  LOCKSTEP_CHECK(broadcasts_to(src.shape(), shape()),
                 "copy_: source of shape {} does not broadcast to {}", shape_str(src.shape()),
                 shape_str(shape()));
  if (src.dtype() == dtype() && same_view(src, *this)) {
    storage()->bump_version();  // x.copy_(x): nothing to move
    return *this;
  }
  if (const Device d = kernel_device(*this, &src); !d.is_cpu()) {
    device_backend(d).copy(*this, src);
    storage()->bump_version();
    return *this;
  }
  dispatch_all(dtype(), [&](auto dtag) {
    using D = decltype(dtag);
    dispatch_all(src.dtype(), [&](auto stag) {
      using S = decltype(stag);
      D* d = static_cast<D*>(storage()->data()) + storage_offset();
      const S* s = static_cast<const S*>(src.storage()->data()) + src.storage_offset();
      detail::strided_loop<2>(
          shape(), {strides(), detail::broadcast_strides(src, shape())},
          [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
            if constexpr (std::is_same_v<D, S>) {
              if (st[0] == 1 && st[1] == 1) {
                std::memcpy(d + off[0], s + off[1], n * sizeof(D));
                return;
              }
            }
            for (int64_t i = 0; i < n; ++i)
              d[off[0] + i * st[0]] = detail::convert<D>(s[off[1] + i * st[1]]);
          });
    });
  });
  storage()->bump_version();
  return *this;
}

Tensor& Tensor::fill_(double value) {
  check_inplace(*this, "fill_");
  check_fill_value(dtype(), value);
  if (!device().is_cpu()) {
    device_backend(device()).fill(*this, value);
    storage()->bump_version();
    return *this;
  }
  dispatch_all(dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = detail::convert<T>(value);
    T* d = static_cast<T*>(storage()->data()) + storage_offset();
    detail::strided_loop<1>(shape(), {strides()},
                            [&](const std::array<int64_t, 1>& off, int64_t n,
                                const std::array<int64_t, 1>& st) {
                              for (int64_t i = 0; i < n; ++i) d[off[0] + i * st[0]] = v;
                            });
  });
  storage()->bump_version();
  return *this;
}

Tensor& Tensor::zero_() { return fill_(0.0); }

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  check_inplace(*this, "add_", &other);
  LOCKSTEP_CHECK(broadcasts_to(other.shape(), shape()),
                 "add_: operand of shape {} does not broadcast to {}", shape_str(other.shape()),
                 shape_str(shape()));
  check_operand_device(*this, other, "add_");
  check_integral_result(*this, "add_", other.dtype(), alpha);
  if (dtype() == DType::boolean && alpha != 0) alpha = 1;  // PyTorch's bool(alpha): an or
  if (!device().is_cpu()) {
    device_backend(device()).add_into(*this, other, alpha);
    storage()->bump_version();
    return *this;
  }
  if (alpha == 1.0) {
    combine_inplace(*this, other, "add_", [](auto x, auto y) { return x + y; });
  } else {
    combine_inplace(*this, other, "add_", [alpha](auto x, auto y) {
      return x + static_cast<decltype(x)>(alpha) * y;
    });
  }
  storage()->bump_version();
  return *this;
}

Tensor& Tensor::mul_(const Tensor& other) {
  check_inplace(*this, "mul_", &other);
  LOCKSTEP_CHECK(broadcasts_to(other.shape(), shape()),
                 "mul_: operand of shape {} does not broadcast to {}", shape_str(other.shape()),
                 shape_str(shape()));
  check_operand_device(*this, other, "mul_");
  check_integral_result(*this, "mul_", other.dtype(), 1.0);
  if (!device().is_cpu()) {
    device_backend(device()).mul_into(*this, other);
    storage()->bump_version();
    return *this;
  }
  combine_inplace(*this, other, "mul_", [](auto x, auto y) { return x * y; });
  storage()->bump_version();
  return *this;
}

Tensor& Tensor::mul_(double factor) {
  check_integral_result(*this, "mul_", dtype(), factor);
  LOCKSTEP_CHECK(dtype() != DType::boolean || factor == 0 || factor == 1,
                 "mul_: a bool tensor can be multiplied by 0 or 1 (false, true) only, not {}; "
                 "convert it with .to(DType::u8) first",
                 factor);
  if (!device().is_cpu()) {
    check_inplace(*this, "mul_");
    device_backend(device()).mul_scalar_into(*this, factor);
    storage()->bump_version();
    return *this;
  }
  return mul_(Tensor::scalar(factor, operand_dtype(dtype(), DType::f64)));
}

}  // namespace lockstep::runtime
