// In-place writes: copy_, fill_, zero_, add_, mul_. Each bumps the storage's
// version so that autograd notices a change to a tensor saved for backward.
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/device_backend.h"
#include "lockstep/runtime/ops/detail/convert.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/detail/strided_loop.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

namespace {

void check_inplace(const Tensor& t, const char* op) {
  LOCKSTEP_CHECK(!(grad_enabled() && t.requires_grad()),
                 "{}: in-place change of a tensor that requires grad (shape {}) while grad mode "
                 "is on; autograd cannot track it. Do it under NoGradGuard (as optimizers do) or "
                 "use the out-of-place op.",
                 op, shape_str(t.shape()));
}

// The device whose backend runs an in-place op: dst's, or src's for a copy_
// from a device into host memory. The CPU's loops below when both are there.
Device kernel_device(const Tensor& dst, const Tensor* src = nullptr) {
  return dst.device().is_cpu() && src != nullptr ? src->device() : dst.device();
}

// dst op= f(src) elementwise, src broadcast to dst's shape and already of dst's dtype.
template <class T, class F>
void apply_inplace(const Tensor& dst, const Tensor& src, F f) {
  T* d = static_cast<T*>(dst.storage()->data()) + dst.storage_offset();
  const T* s = static_cast<const T*>(src.storage()->data()) + src.storage_offset();
  detail::strided_loop<2>(
      dst.shape(), {dst.strides(), detail::broadcast_strides(src, dst.shape())},
      [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
        T* dp = d + off[0];
        const T* sp = s + off[1];
        if (st[0] == 1 && st[1] == 1) {
          for (int64_t i = 0; i < n; ++i) dp[i] = f(dp[i], sp[i]);
        } else if (st[0] == 1 && st[1] == 0) {
          const T v = *sp;
          for (int64_t i = 0; i < n; ++i) dp[i] = f(dp[i], v);
        } else {
          for (int64_t i = 0; i < n; ++i) dp[i * st[0]] = f(dp[i * st[0]], sp[i * st[1]]);
        }
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
  check_inplace(*this, "copy_");
  LOCKSTEP_CHECK(broadcasts_to(src.shape(), shape()),
                 "copy_: source of shape {} does not broadcast to {}", shape_str(src.shape()),
                 shape_str(shape()));
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
  check_inplace(*this, "add_");
  LOCKSTEP_CHECK(broadcasts_to(other.shape(), shape()),
                 "add_: operand of shape {} does not broadcast to {}", shape_str(other.shape()),
                 shape_str(shape()));
  if (!device().is_cpu()) {
    device_backend(device()).add_into(*this, other, alpha);
    storage()->bump_version();
    return *this;
  }
  Tensor src = other.to(dtype());
  dispatch_compute(dtype(), "add_", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const C a = static_cast<C>(alpha);
    if (alpha == 1.0)
      apply_inplace<T>(*this, src, [](T x, T y) { return static_cast<T>(C(x) + C(y)); });
    else
      apply_inplace<T>(*this, src, [a](T x, T y) { return static_cast<T>(C(x) + a * C(y)); });
  });
  storage()->bump_version();
  return *this;
}

Tensor& Tensor::mul_(const Tensor& other) {
  check_inplace(*this, "mul_");
  LOCKSTEP_CHECK(broadcasts_to(other.shape(), shape()),
                 "mul_: operand of shape {} does not broadcast to {}", shape_str(other.shape()),
                 shape_str(shape()));
  if (!device().is_cpu()) {
    device_backend(device()).mul_into(*this, other);
    storage()->bump_version();
    return *this;
  }
  Tensor src = other.to(dtype());
  dispatch_compute(dtype(), "mul_", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    apply_inplace<T>(*this, src, [](T x, T y) { return static_cast<T>(C(x) * C(y)); });
  });
  storage()->bump_version();
  return *this;
}

Tensor& Tensor::mul_(double factor) {
  if (!device().is_cpu()) {
    check_inplace(*this, "mul_");
    device_backend(device()).mul_scalar_into(*this, factor);
    storage()->bump_version();
    return *this;
  }
  return mul_(Tensor::scalar(factor, dtype()));
}

}  // namespace lockstep::runtime
