// The element-wise reductions the gloo backend hands to gloo, for every
// collectives dtype and ReduceOp.
//
// gloo only moves bytes; it calls our function to combine two chunks. bf16 and
// f16 combine in float and round back once per pairwise step (as NCCL does).
// Avg reduces as Sum; divide_by() then divides the result by the group size
// on the background thread (integers truncate toward zero).
#pragma once

#include <cstddef>
#include <functional>

#include "lockstep/collectives/types.h"
#include "lockstep/runtime/dtype.h"

namespace lockstep::collectives::gloo_backend {

// out[i] = a[i] (op) b[i] for i < n; out may alias a or b.
using ReduceFn = std::function<void(void* out, const void* a, const void* b, size_t n)>;

ReduceFn reduce_function(runtime::DType dtype, ReduceOp op);

// data[i] /= divisor for i < n, in the dtype's own arithmetic.
void divide_by(void* data, runtime::DType dtype, size_t n, int divisor);

}  // namespace lockstep::collectives::gloo_backend
