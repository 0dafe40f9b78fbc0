// Dropout and embedding kernels.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "lockstep/runtime/cuda/kernels/kernel_types.h"

namespace lockstep::runtime::cuda::kernels {

// Element i of x (contiguous, n elements, f32/f64/bf16/f16) is kept when draw
// offset + i of the Philox4x32-10 stream keyed by `seed` (runtime/random.h,
// the same stream as the CPU generator) is below `threshold`; y = x * scale
// where kept, else 0, and mask[i] = kept. The same generator state gives the
// CPU op's mask exactly.
cudaError_t dropout_forward(ScalarType dtype, const void* x, void* y, uint8_t* mask, int64_t n,
                            uint64_t seed, uint64_t offset, uint64_t threshold, double scale,
                            cudaStream_t stream);
// grad_x = grad_y * scale where mask, else 0 (contiguous, n elements).
cudaError_t dropout_backward(ScalarType dtype, const void* grad_y, const uint8_t* mask,
                             void* grad_x, int64_t n, double scale, cudaStream_t stream);

// out[i] = row indices[i] of weight ([rows, row_bytes / element size],
// contiguous), copied as bytes (any dtype). indices (i32 or i64, n of them)
// are not checked on the host: a row outside [0, rows) comes out as all-ones
// bytes, NaN for the floating dtypes.
cudaError_t embedding_forward(const void* indices, ScalarType index_dtype, int64_t n,
                              const void* weight, int64_t rows, size_t row_bytes, void* out,
                              cudaStream_t stream);
// grad_weight[indices[i], :] += grad[i, :] by atomic adds, so the order of
// additions to a repeated row varies from run to run. grad [n, dim] is
// f32/f64/bf16/f16; grad_weight [rows, dim] is zeroed by the caller and is f32
// (f64 for an f64 grad). Out-of-range indices add nothing, nor does row
// padding_idx (-1 for none).
cudaError_t embedding_backward(ScalarType grad_dtype, const void* grad, const void* indices,
                               ScalarType index_dtype, int64_t n, int64_t rows, int64_t dim,
                               int64_t padding_idx, void* grad_weight, cudaStream_t stream);

}  // namespace lockstep::runtime::cuda::kernels
