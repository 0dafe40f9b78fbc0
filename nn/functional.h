// nn::functional: the stateless ops, as torch.nn.functional. These are the
// runtime's differentiable ops, re-exported so model code can say
// `namespace F = lockstep::nn::functional;` and `F::relu(x)`.
#pragma once

#include "lockstep/nn/conv.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/ops/pad.h"

namespace lockstep::nn::functional {

using runtime::BceOptions;
using runtime::BceWithLogitsOptions;
using runtime::Conv2dOptions;
using runtime::KlDivReduction;
using runtime::NllOptions;
using runtime::PadMode;
using runtime::Pool2dOptions;
using runtime::Reduction;

using runtime::adaptive_avg_pool2d;
using runtime::avg_pool2d;
using runtime::batch_norm;
using runtime::binary_cross_entropy;
using runtime::binary_cross_entropy_with_logits;
using runtime::conv2d;
using runtime::cross_entropy;
using runtime::dropout;
using runtime::embedding;
using runtime::gelu;
using runtime::huber_loss;
using runtime::kl_div;
using runtime::l1_loss;
using runtime::layer_norm;
using runtime::linear;
using runtime::log_softmax;
using runtime::max_pool2d;
using runtime::mse_loss;
using runtime::nll_loss;
using runtime::pad2d;
using runtime::relu;
using runtime::sigmoid;
using runtime::smooth_l1_loss;
using runtime::softmax;
using runtime::tanh;

// torch.nn.functional.conv2d's padding argument: a size, "same" or "valid",
// padded as Conv2d pads it (conv.h; "same" needs stride 1): F::conv2d(x, w,
// b, "same"), or 1, or Size2(1, 2) (a bare {1, 2} is ambiguous with the
// overload above, which takes runtime::Conv2dOptions).
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
              Conv2dPadding padding, Size2 stride = 1, Size2 dilation = 1, int64_t groups = 1);

}  // namespace lockstep::nn::functional
