// Matrix products, differentiable: OpenBLAS (sgemm / dgemm) on the CPU, cuBLAS
// on CUDA (TF32 only with cuda::set_allow_tf32(true)).
#pragma once

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

// torch.matmul's shapes: [m, k] x [k, n] -> [m, n]; 1-D x 1-D -> a 0-d dot; a
// 1-D a is [1, k] and a 1-D b is [k, 1], that dim dropped from the result; the
// batch dims before the last two broadcast against each other ([1, m, k] x
// [b, k, n] and [m, k] x [b, k, n] -> [b, m, n]; [B, H, T, D] x [B, H, D, T]).
// 0-d operands are refused. Gradients are summed back over broadcast dims.
Tensor matmul(const Tensor& a, const Tensor& b);
// x [.., in] , weight [out, in], bias [out] (may be undefined) -> [.., out].
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

}  // namespace lockstep::runtime
