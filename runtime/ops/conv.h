// 2-D convolution (NCHW), differentiable: im2col + OpenBLAS gemm on the CPU,
// cuDNN on CUDA.
#pragma once

#include <array>

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

struct Conv2dOptions {
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
};

// x [N, C_in, H, W], weight [C_out, C_in/groups, kH, kW], bias [C_out] or undefined.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {},
              const Conv2dOptions& opts = {});

}  // namespace lockstep::runtime
