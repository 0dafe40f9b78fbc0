// Avg of bf16 and f16 on the CPU backends reduces a float copy of the data
// and rounds the mean back to 16 bits once: the ranks' sum leaves f16's range
// (65504) long before their mean does (two ranks averaging 40000 got inf),
// and rounding every partial sum to 8 or 11 bits loses what the division
// would have kept. The result is the float sum divided by the group size, the
// same on every backend. It moves twice the bytes; Sum, Min, Max and Product
// of 16-bit data stay 16-bit (their result is no smaller than their inputs).
//
// A backend reduces in_reduction_dtype(t, op) in place of `t`, then calls
// write_back(t, reduced).
#pragma once

#include "lockstep/collectives/types.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::collectives {

// f32 for Avg of bf16 and f16; `dtype` otherwise.
runtime::DType reduction_dtype(runtime::DType dtype, ReduceOp op);

// `t` itself where `op` reduces t's dtype as it is; otherwise a new f32
// tensor of t's shape, holding t's values when `with_values`.
runtime::Tensor in_reduction_dtype(const runtime::Tensor& t, ReduceOp op,
                                   bool with_values = true);

// Where `reduced` is not `t`: writes its values into `t`, rounded to t's
// dtype (the raw data: no autograd, as every collective).
void write_back(const runtime::Tensor& t, const runtime::Tensor& reduced);

}  // namespace lockstep::collectives
