// Elementwise arithmetic with NumPy/PyTorch broadcasting, differentiable.
#pragma once

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a + alpha*b
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor pow(const Tensor& a, double exponent);
Tensor abs(const Tensor& a);
// Not differentiable: comparison results are bool tensors.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);

// The dtype a binary op of a and b computes and returns in, as
// torch.result_type: a 0-d tensor takes part only when its kind (bool, then
// integer, then floating) is above every other operand's, so a bf16 tensor
// times a 0-d f32 tensor stays bf16, and an i32 tensor plus a 0-d f64 is f64.
DType result_type(const Tensor& a, const Tensor& b);

// Shape that a and b broadcast to, or an error naming both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b);
// Sums `g` down to `shape` (the inverse of broadcasting), for backward.
Tensor sum_to(const Tensor& g, const Shape& shape);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double s) { return add(a, s); }
inline Tensor operator-(const Tensor& a, double s) { return add(a, -s); }
inline Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
inline Tensor operator/(const Tensor& a, double s) { return mul(a, 1.0 / s); }
inline Tensor operator*(double s, const Tensor& a) { return mul(a, s); }
inline Tensor operator-(const Tensor& a) { return neg(a); }

}  // namespace lockstep::runtime
