// The CUDA side of runtime/ops/elementwise.h (and of activations built on
// the same kernels): fresh outputs on the operands' device, no autograd (the
// ops in runtime/ops record it, the same for both devices).
#pragma once

#include "lockstep/runtime/cuda/kernels/elementwise.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::cuda {

// op(a, b) over the broadcast shape, computed in `dtype` (both operands are
// converted to it); the output has `dtype`, or bool for comparisons. One of
// a and b may be a 0-dim CPU tensor (a scalar), the other must be on CUDA.
Tensor binary_op(kernels::BinaryOp op, const Tensor& a, const Tensor& b, DType dtype,
                 double alpha = 1.0, const char* name = "binary op");

// op(a, scalar) into a tensor of a's shape and dtype.
Tensor unary_op(kernels::UnaryOp op, const Tensor& a, double scalar = 0.0,
                const char* name = "unary op");

}  // namespace lockstep::runtime::cuda
