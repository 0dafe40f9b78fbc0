// The element-wise reductions of the CPU backends, for every collectives
// dtype and ReduceOp.
//
// gloo and shm only move bytes; they call these to combine chunks. bf16 and
// f16 combine in float and round back once per pairwise step (as NCCL does);
// their Avg reaches these kernels as f32 (float_average.h). Avg reduces as
// Sum; divide_by() then divides the result by the group size (integers
// truncate toward zero). Integer Sum and Product wrap around (two's
// complement; u8 modulo 256). bool Sum and Max are a logical or, Product and
// Min a logical and, as PyTorch's; u8 and bool have no Avg. Max and Min
// return NaN wherever any rank holds one (torch.maximum's rule), and take +0
// as larger than -0, whatever the rank and the slicing.
#pragma once

#include <cstddef>

#include "lockstep/collectives/types.h"
#include "lockstep/runtime/dtype.h"

namespace lockstep::collectives {

// out[i] = a[i] (op) b[i] for i < n; out may alias a or b. Throws for a dtype
// collectives do not support.
void combine(runtime::DType dtype, ReduceOp op, void* out, const void* a, const void* b, size_t n);

// data[i] /= divisor for i < n, in the dtype's own arithmetic.
void divide_by(void* data, runtime::DType dtype, size_t n, int divisor);

}  // namespace lockstep::collectives
