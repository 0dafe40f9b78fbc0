// Reductions over a set of dimensions of a strided tensor: sum (with a scale,
// for mean) and max with its first index (max, argmax), plus the gather that
// routes max's gradient back.
//
// The host describes the input as two groups of dimensions, each merged where
// it is contiguous (cuda/core/coalesce_dims.h): the kept dimensions, in the
// output's order (output element m is linear index m over them, the output
// being contiguous), and the reduced ones. plan_reduce picks the kernel from
// the strides; its plan and workspace size must be passed unchanged to reduce.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "lockstep/runtime/cuda/kernels/kernel_types.h"

namespace lockstep::runtime::cuda::kernels {

struct ReduceArgs {
  const void* in = nullptr;  // element 0 of the input view
  ScalarType in_dtype = ScalarType::f32;
  void* out = nullptr;  // values: sum result, or max values; null for argmax
  ScalarType out_dtype = ScalarType::f32;
  int64_t* out_index = nullptr;  // max/argmax: index along the reduced dim
  int64_t num_outputs = 0;       // product of kept sizes
  int64_t reduce_size = 0;       // product of reduced sizes
  int kept_ndim = 0;
  int64_t kept_sizes[kMaxDims] = {};
  int64_t kept_strides[kMaxDims] = {};
  int reduce_ndim = 0;
  int64_t reduce_sizes[kMaxDims] = {};
  int64_t reduce_strides[kMaxDims] = {};
};

enum class ReduceOp : uint8_t {
  sum,  // out = scale * sum; floats accumulate in f32 (f64 for f64), integers in i64
  max,  // out = max, out_index = its index (first of equals; NaN wins, the first NaN)
};

// How the reduction runs. Rows: the reduced elements of one output are
// contiguous, so a warp or a block reads them. Columns: neighbouring outputs
// are neighbours in memory, so each thread owns one output and the block's
// threads read neighbouring addresses. `splits` > 1 cuts the reduced range
// into chunks reduced by different blocks into a workspace of partials,
// combined (in a fixed order) by a last small kernel.
struct ReducePlan {
  bool columns = false;
  bool block_per_output = false;  // rows: a whole block per output, else a warp
  int vec = 1;                    // elements per vector load (rows)
  int block_x = 32, block_y = 8;
  int64_t grid_x = 1;
  int64_t splits = 1;
  int64_t chunk = 0;  // reduced elements per split
  size_t workspace_bytes = 0;
};

// `device` is the input's CUDA device (its SM count sizes the grid).
ReducePlan plan_reduce(ReduceOp op, const ReduceArgs& args, int device);

// Queues the reduction on `stream`. `workspace` holds plan.workspace_bytes
// (null when 0). `scale` multiplies sums (ignored by max).
cudaError_t reduce(ReduceOp op, const ReduceArgs& args, const ReducePlan& plan, double scale,
                   void* workspace, cudaStream_t stream);

// Gradient of max along one dimension, as a gather: grad_in (contiguous
// [outer, n, inner], of `dtype`) = grad_out[o, i] where index[o, i] == j,
// else 0. grad_out and index are contiguous [outer, inner]. Every element of
// grad_in is written.
cudaError_t max_backward(ScalarType dtype, const void* grad_out, const int64_t* index,
                         void* grad_in, int64_t outer, int64_t n, int64_t inner,
                         cudaStream_t stream);

}  // namespace lockstep::runtime::cuda::kernels
