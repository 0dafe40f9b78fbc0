// The CUDA side of runtime/ops/reduce.h: kernels over CUDA tensors of any
// layout, without autograd (runtime/ops/reduce.cpp records it for both
// devices). No host synchronisation.
#pragma once

#include <vector>

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::cuda {

// scale * (sum of `a` over `dims`: sorted, unique, in range), in the keepdim
// shape, as `out_dtype`. Floats accumulate in f32 (f64 for f64), integers
// and bool in i64.
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, double scale, DType out_dtype);

// Largest value along `dim` (in range; a 0-dim `a` is one element) and its
// index (i64; the first of equal maxima, NaN beating every number), in the
// shape of `a` without `dim`. `values` is left undefined unless wanted.
// f32, f64, bf16, f16, i32, i64.
struct MaxAlong {
  Tensor values;
  Tensor indices;
};
MaxAlong max_along(const Tensor& a, int64_t dim, bool want_values);

// Gradient of max along `dim` of an input of `in_shape` and `dtype`: `grad`
// (shape of the values) routed to the positions in `indices`, zero elsewhere.
Tensor max_backward(const Tensor& grad, const Tensor& indices, const Shape& in_shape,
                    int64_t dim, DType dtype);

}  // namespace lockstep::runtime::cuda
