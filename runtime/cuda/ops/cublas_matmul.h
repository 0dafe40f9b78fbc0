// Matrix products of CUDA tensors on cuBLAS: the device side of
// runtime/ops/linalg.cpp (matmul, linear), which keeps the argument checks and
// the autograd wiring for both devices.
//
// Layout: lockstep tensors are row-major, cuBLAS is column-major. A row-major
// [r, c] matrix with row stride ld is the column-major [c, r] matrix (its
// transpose) with leading dimension ld, so C = A @ B is computed as
// C^T = B^T @ A^T with the operands swapped and no copies. An operand stored
// transposed (unit stride in its first dim, e.g. w.t()) is passed with
// CUBLAS_OP_T instead, also without a copy; anything else is made contiguous.
//
// dtypes: f32 (CUBLAS_COMPUTE_32F, or _FAST_TF32 when allow_tf32(), see
// math_mode.h), f64 (cublasDgemm), bf16 and f16 (stored in 16 bits, computed
// in f32). Everything is queued on the current stream of the tensors' device;
// nothing synchronises the host.
#pragma once

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::cuda {

// c = alpha * a @ b + beta * c for 2-D views on one CUDA device: a [m, k],
// b [k, n], c [m, n] with unit stride in its last dim. One dtype for all.
void gemm(const Tensor& a, const Tensor& b, Tensor& c, double alpha = 1.0, double beta = 0.0);

// c[i] = a[i] @ b[i] for 3-D a [batch, m, k], b [batch, k, n] (a batch stride
// of 0, as from expand(), is fine) into a contiguous c [batch, m, n]: one
// strided-batched cuBLAS call.
void gemm_batched(const Tensor& a, const Tensor& b, Tensor& c);

// The sums of the rows of a 2-D x [r, n]: a new [n] tensor, x^T @ ones on
// cuBLAS (the bias gradient of linear).
Tensor sum_rows(const Tensor& x);

}  // namespace lockstep::runtime::cuda
