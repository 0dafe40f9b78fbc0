// Matrix products, differentiable: OpenBLAS (sgemm / dgemm) on the CPU, cuBLAS
// on CUDA (TF32 only with cuda::set_allow_tf32(true)).
#pragma once

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

// [m,k] x [k,n] -> [m,n]; also batched [b,m,k] x [b,k,n] and [.., m, k] x [k, n].
Tensor matmul(const Tensor& a, const Tensor& b);
// x [.., in] , weight [out, in], bias [out] (may be undefined) -> [.., out].
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

}  // namespace lockstep::runtime
