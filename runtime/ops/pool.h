// 2-D pooling (NCHW), differentiable.
#pragma once

#include <array>

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

struct Pool2dOptions {
  std::array<int64_t, 2> kernel{2, 2};
  std::array<int64_t, 2> stride{0, 0};  // 0: same as kernel (PyTorch's default)
  std::array<int64_t, 2> padding{0, 0};
  // As PyTorch: the output size rounds up, not down, so a last window that
  // starts inside the input (or its top / left padding) but runs past its end
  // is kept, clipped; an average divides by its part inside the padded input.
  bool ceil_mode = false;
};

Tensor max_pool2d(const Tensor& x, const Pool2dOptions& opts);
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& opts);  // count_include_pad = true
Tensor adaptive_avg_pool2d(const Tensor& x, std::array<int64_t, 2> output_size);

}  // namespace lockstep::runtime
