// Internal: the losses over classes (cross_entropy, nll_loss) take, as
// PyTorch's, an input [N, C, d1, ...] with a target [N, d1, ...]: each
// position (n, d1, ...) is one sample, whose class scores are
// input[n, :, d1, ...]. class_rows turns that into the [N * d1 * ..., C]
// rows and [N * d1 * ...] targets the [N, C] losses take; the Mean over the
// rows is then PyTorch's Mean over every position, and a None result has the
// target's shape.
#pragma once

#include <numeric>
#include <vector>

#include "lockstep/runtime/error.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::detail {

struct ClassRows {
  Tensor input;   // [rows, C], classes last
  Tensor target;  // [rows]
};

// `input` of 3 or more dims; `loss` names the caller in the errors.
inline ClassRows class_rows(const Tensor& input, const Tensor& target, const char* loss) {
  const Shape& s = input.shape();
  Shape want{s[0]};
  want.insert(want.end(), s.begin() + 2, s.end());
  LOCKSTEP_CHECK(target.shape() == want,
                 "{}: for an input {} = [N, C, d1, ...] the target must be [N, d1, ...] = {} "
                 "class indices, got {}",
                 loss, shape_str(s), shape_str(want), shape_str(target.shape()));
  std::vector<int64_t> classes_last(s.size());
  std::iota(classes_last.begin(), classes_last.end(), 0);
  classes_last.erase(classes_last.begin() + 1);
  classes_last.push_back(1);
  return {input.permute(classes_last).reshape({-1, s[1]}), target.reshape({-1})};
}

}  // namespace lockstep::runtime::detail
