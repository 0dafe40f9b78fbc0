// Elementwise CUDA kernels over ElementwiseArgs (kernel_types.h): copies with
// dtype conversion, fill, and the unary and binary arithmetic of
// runtime/ops/elementwise.h and the activations. Every launcher queues work on
// `stream` and returns the launch error (cudaSuccess when queued); none
// synchronises the host.
#pragma once

#include <cuda_runtime_api.h>

#include "lockstep/runtime/cuda/kernels/kernel_types.h"
#include "lockstep/runtime/ops/elementwise_codes.h"

namespace lockstep::runtime::cuda::kernels {

using runtime::BinaryOp;
using runtime::UnaryOp;

// out (operand 0) = convert(in (operand 1)), any dtypes.
cudaError_t copy(const ElementwiseArgs<2>& args, cudaStream_t stream);

// Every element of operand 0 = value, converted to its dtype.
cudaError_t fill(const ElementwiseArgs<1>& args, double value, cudaStream_t stream);

// out (operand 0) = op(in (operand 1), scalar); both of one floating dtype
// (f32, f64, bf16, f16; bf16/f16 compute in f32), or i32/i64 for neg, abs,
// add_scalar, mul_scalar, relu and sign.
cudaError_t unary(UnaryOp op, const ElementwiseArgs<2>& args, double scalar, cudaStream_t stream);

// out (operand 0) = op(a (operand 1), b (operand 2), alpha). a and b share one
// dtype; out has it too, or bool for the comparisons. Integer dtypes for the
// arithmetic and comparisons; floating dtypes for everything.
cudaError_t binary(BinaryOp op, const ElementwiseArgs<3>& args, double alpha, cudaStream_t stream);

}  // namespace lockstep::runtime::cuda::kernels
