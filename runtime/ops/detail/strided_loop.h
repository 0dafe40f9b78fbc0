// Internal: iteration over N operands that share a logical shape but have
// their own strides (0 where an operand is broadcast). Adjacent dims that are
// contiguous for every operand are merged first, so contiguous operands run
// as one flat inner loop.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::detail {

// Strides of `t` when broadcast to `shape` (0 on broadcast dims).
Shape broadcast_strides(const Tensor& t, const Shape& shape);

// Calls inner(offsets, n, inner_strides) for each innermost row, where
// offsets[k] is the element offset of operand k at the row start.
template <size_t N, class Inner>
void strided_loop(const Shape& shape, const std::array<Shape, N>& strides, Inner&& inner) {
  // Merge dims: walk from the innermost outwards.
  std::vector<int64_t> sizes;
  std::vector<std::array<int64_t, N>> st;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    std::array<int64_t, N> s{};
    for (size_t k = 0; k < N; ++k) s[k] = strides[k][d];
    if (!sizes.empty()) {
      bool mergeable = true;
      for (size_t k = 0; k < N; ++k)
        if (s[k] != st.back()[k] * sizes.back()) mergeable = false;
      if (mergeable) {
        sizes.back() *= shape[d];
        continue;
      }
    }
    sizes.push_back(shape[d]);
    st.push_back(s);
  }
  for (int64_t v : shape)
    if (v == 0) return;
  std::array<int64_t, N> offsets{};
  if (sizes.empty()) {  // a single element
    inner(offsets, int64_t{1}, std::array<int64_t, N>{});
    return;
  }
  // sizes[0] is the innermost dim.
  const size_t nd = sizes.size();
  std::vector<int64_t> counter(nd, 0);
  while (true) {
    inner(offsets, sizes[0], st[0]);
    size_t d = 1;
    for (; d < nd; ++d) {
      ++counter[d];
      for (size_t k = 0; k < N; ++k) offsets[k] += st[d][k];
      if (counter[d] < sizes[d]) break;
      for (size_t k = 0; k < N; ++k) offsets[k] -= st[d][k] * sizes[d];
      counter[d] = 0;
    }
    if (d == nd) return;
  }
}

}  // namespace lockstep::runtime::detail
