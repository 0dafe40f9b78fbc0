// Internal: elementwise maps over floating tensors into fresh contiguous
// outputs, shared by the elementwise ops and the activations. bf16 and f16
// load and store as such and compute in float (compute_t).
#pragma once

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::detail {

// out[i] = f(x[i]) over a contiguous copy of x.
template <class F>
Tensor map_float(const Tensor& x, const char* name, F f) {
  Tensor c = x.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  dispatch_floating(x.dtype(), name, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* xp = c.data_ptr<T>();
    T* yp = out.data_ptr<T>();
    const int64_t n = c.numel();
    for (int64_t i = 0; i < n; ++i) yp[i] = static_cast<T>(f(static_cast<C>(xp[i])));
  });
  return out;
}

// out[i] = f(a[i], b[i]) for same-shape tensors (a gradient and a saved tensor).
template <class F>
Tensor zip_float(const Tensor& a, const Tensor& b, const char* name, F f) {
  Tensor ca = a.contiguous().to(b.dtype()), cb = b.contiguous();
  Tensor out = Tensor::empty(b.shape(), b.dtype());
  dispatch_floating(b.dtype(), name, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* ap = ca.data_ptr<T>();
    const T* bp = cb.data_ptr<T>();
    T* op = out.data_ptr<T>();
    const int64_t n = cb.numel();
    for (int64_t i = 0; i < n; ++i)
      op[i] = static_cast<T>(f(static_cast<C>(ap[i]), static_cast<C>(bp[i])));
  });
  return out;
}

}  // namespace lockstep::runtime::detail
