// CPU kernels behind GELU for f32, bf16 and f16 (f32 math on the stored
// values, four lanes at a time; f64 keeps libm's erf in activation.cpp).
// Raw pointers over contiguous data; activation.cpp does the checking and the
// autograd wiring.
#pragma once

#include <cstdint>

namespace lockstep::runtime::activation_kernels {

// y = x Phi(x), Phi(x) = (1 + erf(x / sqrt(2))) / 2, the standard normal CDF.
template <class T>
void gelu_forward(const T* x, T* y, int64_t n);

// grad_x = grad_y (Phi(x) + x phi(x)), phi the standard normal density.
template <class T>
void gelu_backward(const T* grad_y, const T* x, T* grad_x, int64_t n);

}  // namespace lockstep::runtime::activation_kernels
