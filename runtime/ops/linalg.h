// Matrix products on OpenBLAS (sgemm / dgemm), differentiable.
#pragma once

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

// [m,k] x [k,n] -> [m,n]; also batched [b,m,k] x [b,k,n] and [.., m, k] x [k, n].
Tensor matmul(const Tensor& a, const Tensor& b);
// x [.., in] , weight [out, in], bias [out] (may be undefined) -> [.., out].
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

}  // namespace lockstep::runtime
