#include "lockstep/runtime/cuda/core/coalesce_dims.h"

#include <algorithm>

namespace lockstep::runtime::cuda {

CoalescedDims coalesce_dims(const std::vector<int64_t>& sizes,
                            const std::vector<std::vector<int64_t>>& strides) {
  const size_t operands = strides.size();
  CoalescedDims out;
  out.strides.resize(operands);
  for (int64_t s : sizes) {
    if (s == 0) {  // nothing to visit
      out.sizes = {0};
      for (auto& st : out.strides) st = {0};
      return out;
    }
  }
  // Innermost first while merging; reversed at the end.
  for (size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] == 1) continue;
    bool merge = !out.sizes.empty();
    for (size_t k = 0; merge && k < operands; ++k)
      merge = strides[k][d] == out.strides[k].back() * out.sizes.back();
    if (merge) {
      out.sizes.back() *= sizes[d];
      continue;
    }
    out.sizes.push_back(sizes[d]);
    for (size_t k = 0; k < operands; ++k) out.strides[k].push_back(strides[k][d]);
  }
  std::reverse(out.sizes.begin(), out.sizes.end());
  for (auto& st : out.strides) std::reverse(st.begin(), st.end());
  return out;
}

}  // namespace lockstep::runtime::cuda
