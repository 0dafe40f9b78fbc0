// Internal: C = alpha * A @ B + beta * C on OpenBLAS, for 2-D views.
// A and B may be transposed views (unit stride in either dim) without a copy;
// C must be row-major contiguous in its last dim.
#pragma once

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::detail {

void gemm(const Tensor& a, const Tensor& b, Tensor& c, double alpha = 1.0, double beta = 0.0);

}  // namespace lockstep::runtime::detail
