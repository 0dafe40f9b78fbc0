// The CUDA side of dropout and embedding (runtime/ops/misc.h): kernels into
// outputs that runtime/ops/misc.cpp allocated (contiguous, on the input's
// device) after its checks; it records autograd for both devices. cat on CUDA
// needs no kernel of its own (slices and Tensor::copy_).
#pragma once

#include <cstdint>

#include "lockstep/runtime/random.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::cuda {

// y = x * scale where the generator's next draw (one per element, in order)
// is below `threshold`, else 0; mask (u8) = kept. Takes the draws from `g`
// as the CPU op does (its offset advances by x.numel()), so a generator in
// the same state yields the same mask on both devices. x contiguous,
// floating (f32, f64, bf16, f16).
void dropout_forward(const Tensor& x, const Tensor& y, const Tensor& mask, uint64_t threshold,
                     double scale, Generator& g);
// grad_x = grad_y * scale where mask, else 0; grad_y and grad_x contiguous.
void dropout_backward(const Tensor& grad_y, const Tensor& mask, double scale,
                      const Tensor& grad_x);

// out [..., dim] = rows `indices` of weight (both contiguous); see
// cuda/kernels/misc.h for indices out of range (not checked on the host).
void embedding_forward(const Tensor& indices, const Tensor& weight, const Tensor& out);
// [rows, dim] gradient of the table: grad [..., dim] added into the rows of
// `indices` (atomic adds in f32, or f64 for f64), in grad's dtype; row
// padding_idx (in [0, rows), or -1 for none) gets none.
Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t rows, int64_t dim,
                          int64_t padding_idx);

}  // namespace lockstep::runtime::cuda
