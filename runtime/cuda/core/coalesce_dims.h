// Merging the dimensions of an elementwise iteration, so that CUDA kernels
// compute fewer index divisions and see one dense dimension whenever they can.
// No CUDA header: tested on machines without a GPU.
#pragma once

#include <cstdint>
#include <vector>

namespace lockstep::runtime::cuda {

struct CoalescedDims {
  std::vector<int64_t> sizes;                 // outermost first
  std::vector<std::vector<int64_t>> strides;  // per operand, aligned with sizes
};

// Drops dimensions of size 1 and merges each pair of neighbouring dimensions
// (outer o, inner i) for which every operand has stride[o] == stride[i] *
// size[i]. Visits the same elements in the same order. A shape with a zero
// size comes back as one dimension of size 0; a scalar as no dimension.
CoalescedDims coalesce_dims(const std::vector<int64_t>& sizes,
                            const std::vector<std::vector<int64_t>>& strides);

}  // namespace lockstep::runtime::cuda
