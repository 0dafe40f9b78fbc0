// Internal: C = alpha * A @ B + beta * C on OpenBLAS, for 2-D views and for
// raw tiles.
// A and B may be transposed views (unit stride in either dim) without a copy;
// C must be row-major contiguous in its last dim. A size or leading
// dimension past OpenBLAS's 32-bit range throws lockstep::Error instead of
// wrapping.
#pragma once

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::detail {

void gemm(const Tensor& a, const Tensor& b, Tensor& c, double alpha = 1.0, double beta = 0.0);

// The same on row-major pointers, for kernels that multiply tiles of larger
// buffers: C = alpha * op(A) op(B) + beta * C with op(A) [m, k], op(B)
// [k, n]; lda, ldb and ldc are row strides.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc);
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc);

}  // namespace lockstep::runtime::detail
