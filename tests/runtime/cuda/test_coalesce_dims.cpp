// Merging the dimensions of an elementwise iteration (runtime/cuda/core/):
// pure index arithmetic, tested on every machine.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "lockstep/runtime/cuda/core/coalesce_dims.h"

namespace {

using lockstep::runtime::cuda::coalesce_dims;
using Dims = std::vector<int64_t>;

// Offsets of every element in iteration order, for `operand`.
std::vector<int64_t> offsets(const Dims& sizes, const Dims& strides) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, off = 0;
    for (size_t d = sizes.size(); d-- > 0;) {
      off += rem % sizes[d] * strides[d];
      rem /= sizes[d];
    }
    out.push_back(off);
  }
  return out;
}

}  // namespace

TEST_CASE("coalesce_dims merges dimensions contiguous in every operand", "[cuda_core]") {
  // [2, 3, 4] contiguous, and a second operand broadcast along dim 1.
  const auto c = coalesce_dims({2, 3, 4}, {{12, 4, 1}, {4, 0, 1}});
  CHECK(c.sizes == Dims{2, 3, 4});  // the broadcast operand blocks every merge
  const auto d = coalesce_dims({2, 3, 4}, {{12, 4, 1}, {12, 4, 1}});
  CHECK(d.sizes == Dims{24});
  CHECK(d.strides[0] == Dims{1});
  CHECK(d.strides[1] == Dims{1});
}

TEST_CASE("coalesce_dims drops size-1 dimensions and keeps the visiting order", "[cuda_core]") {
  const Dims sizes{3, 1, 5, 2};
  const std::vector<Dims> strides{{10, 999, 2, 1}, {1, 7, 6, 3}};  // the second is permuted
  const auto c = coalesce_dims(sizes, strides);
  for (size_t k = 0; k < strides.size(); ++k) {
    INFO("operand " << k);
    CHECK(offsets(c.sizes, c.strides[k]) == offsets(sizes, strides[k]));
  }
  CHECK(c.sizes == Dims{3, 10});  // 5 and 2 merge in both; operand 1 keeps 3 apart
}

TEST_CASE("coalesce_dims handles scalars, zero sizes and a transposed operand", "[cuda_core]") {
  const auto scalar = coalesce_dims({}, {{}, {}});
  CHECK(scalar.sizes.empty());
  CHECK(scalar.strides.size() == 2);
  const auto empty = coalesce_dims({4, 0, 3}, {{3, 3, 1}});
  CHECK(empty.sizes == Dims{0});
  const auto ones = coalesce_dims({1, 1}, {{5, 1}});
  CHECK(ones.sizes.empty());
  // out contiguous [4, 6], in the transpose of a [6, 4] tensor: nothing merges.
  const auto t = coalesce_dims({4, 6}, {{6, 1}, {1, 4}});
  CHECK(t.sizes == Dims{4, 6});
  CHECK(offsets(t.sizes, t.strides[1]) == offsets({4, 6}, {1, 4}));
}
