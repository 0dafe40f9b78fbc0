// Internal: elementwise maps over floating tensors (f32, f64) into fresh
// contiguous outputs, shared by the elementwise ops and the activations.
#pragma once

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::detail {

// out[i] = f(x[i]) over a contiguous copy of x, for f32/f64.
template <class F>
Tensor map_float(const Tensor& x, const char* name, F f) {
  Tensor c = x.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  dispatch_float(x.dtype(), name, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = c.data_ptr<T>();
    T* yp = out.data_ptr<T>();
    const int64_t n = c.numel();
    for (int64_t i = 0; i < n; ++i) yp[i] = f(xp[i]);
  });
  return out;
}

// out[i] = f(a[i], b[i]) for same-shape tensors (a gradient and a saved tensor).
template <class F>
Tensor zip_float(const Tensor& a, const Tensor& b, const char* name, F f) {
  Tensor ca = a.contiguous().to(b.dtype()), cb = b.contiguous();
  Tensor out = Tensor::empty(b.shape(), b.dtype());
  dispatch_float(b.dtype(), name, [&](auto tag) {
    using T = decltype(tag);
    const T* ap = ca.data_ptr<T>();
    const T* bp = cb.data_ptr<T>();
    T* op = out.data_ptr<T>();
    const int64_t n = cb.numel();
    for (int64_t i = 0; i < n; ++i) op[i] = f(ap[i], bp[i]);
  });
  return out;
}

}  // namespace lockstep::runtime::detail
