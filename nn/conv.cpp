#include "lockstep/nn/conv.h"
#include "lockstep/nn/functional.h"

#include <cmath>

#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops.h"

namespace lockstep::nn {

Conv2dPadding::Conv2dPadding(std::string_view name) {
  LOCKSTEP_CHECK(name == "same" || name == "valid",
                 "Conv2d: invalid padding string '{}'; give \"same\", \"valid\" or a size",
                 name);
  mode = name == "same" ? Mode::same : Mode::valid;
}

std::string Conv2dPadding::str() const {
  if (mode == Mode::same) return "same";
  if (mode == Mode::valid) return "valid";
  return size.str();
}

namespace {

void check_padding(const char* who, const Conv2dPadding& padding, Size2 stride) {
  LOCKSTEP_CHECK(padding.size.h >= 0 && padding.size.w >= 0,
                 "{}: padding must be non-negative, got {}", who, padding.str());
  LOCKSTEP_CHECK(padding.mode != Conv2dPadding::Mode::same || stride == Size2(1),
                 "{}: padding=\"same\" needs stride 1, got stride {}; for a strided conv "
                 "give the padding as a size",
                 who, stride.str());
}

// conv2d with the padding (left, right, top, bottom) taken by `mode`. Zeros:
// the conv pads both sides alike, so only what one side needs more is padded
// first. The other modes pad everything first, as PyTorch.
Tensor padded_conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
                     std::array<int64_t, 4> padding, PadMode mode, Size2 stride, Size2 dilation,
                     int64_t groups) {
  const auto [left, right, top, bottom] = padding;
  const bool zeros = mode == PadMode::zeros;
  const Size2 conv_pad = zeros ? Size2(top, left) : Size2(0);
  const Tensor x = zeros ? runtime::pad2d(input, {0, right - left, 0, bottom - top})
                         : runtime::pad2d(input, padding, mode);
  return runtime::conv2d(x, weight, bias,
                         runtime::Conv2dOptions{.stride = stride.arr(),
                                                .padding = conv_pad.arr(),
                                                .dilation = dilation.arr(),
                                                .groups = groups});
}

}  // namespace

// "same", as PyTorch: dim d needs dilation * (kernel - 1) entries in all,
// half on each side and an odd one left over (an even kernel with odd
// dilation) on the bottom / right, so the output keeps the input's size.
std::array<int64_t, 4> Conv2dPadding::amounts(Size2 kernel, Size2 dilation) const {
  switch (mode) {
    case Mode::valid: return {0, 0, 0, 0};
    case Mode::size: return {size.w, size.w, size.h, size.h};
    case Mode::same: break;
  }
  const int64_t total_h = dilation.h * (kernel.h - 1);
  const int64_t total_w = dilation.w * (kernel.w - 1);
  return {total_w / 2, total_w - total_w / 2, total_h / 2, total_h - total_h / 2};
}

Conv2d::Conv2d(int64_t in, int64_t out, Size2 k, Conv2dOptions opts, Generator& gen)
    : in_channels(in), out_channels(out), kernel_size(k), options(opts) {
  LOCKSTEP_CHECK(opts.groups > 0, "Conv2d: groups must be positive, got {}", opts.groups);
  LOCKSTEP_CHECK(in > 0 && out > 0, "Conv2d: in_channels ({}) and out_channels ({}) must be > 0",
                 in, out);
  LOCKSTEP_CHECK(in % opts.groups == 0 && out % opts.groups == 0,
                 "Conv2d: in_channels ({}) and out_channels ({}) must both be divisible by "
                 "groups ({})",
                 in, out, opts.groups);
  LOCKSTEP_CHECK(k.h > 0 && k.w > 0, "Conv2d: kernel_size must be positive, got {}", k.str());
  LOCKSTEP_CHECK(opts.stride.h > 0 && opts.stride.w > 0, "Conv2d: stride must be positive, got {}",
                 opts.stride.str());
  check_padding("Conv2d", opts.padding, opts.stride);
  LOCKSTEP_CHECK(opts.dilation.h > 0 && opts.dilation.w > 0,
                 "Conv2d: dilation must be positive, got {}", opts.dilation.str());

  Tensor w = Tensor::empty({out, in / opts.groups, k.h, k.w});
  runtime::kaiming_uniform_(w, std::sqrt(5.0), gen);
  weight = register_parameter("weight", w);
  if (opts.bias) {
    const int64_t fan_in = runtime::fan_in_and_out(w.shape()).first;
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    Tensor b = Tensor::empty({out});
    runtime::uniform_(b, -bound, bound, gen);
    bias = register_parameter("bias", b);
  }
}

Tensor Conv2d::forward(const Tensor& input) {
  LOCKSTEP_CHECK(input.dim() == 4 && input.size(1) == in_channels,
                 "Conv2d({}, {}): expected input [N, {}, H, W], got {}", in_channels,
                 out_channels, in_channels, runtime::shape_str(input.shape()));
  return padded_conv2d(input, weight, bias, options.padding.amounts(kernel_size, options.dilation),
                       options.padding_mode, options.stride, options.dilation, options.groups);
}

std::string Conv2d::extra_repr() const {
  // PyTorch prints stride always and the rest only when not the default.
  std::string s = fmt::format("{}, {}, kernel_size={}, stride={}", in_channels, out_channels,
                              kernel_size.str(), options.stride.str());
  if (options.padding != Conv2dPadding(0)) s += ", padding=" + options.padding.str();
  if (options.dilation != Size2(1)) s += ", dilation=" + options.dilation.str();
  if (options.groups != 1) s += fmt::format(", groups={}", options.groups);
  if (!options.bias) s += ", bias=false";
  if (options.padding_mode != PadMode::zeros)
    s += fmt::format(", padding_mode={}", runtime::pad_mode_name(options.padding_mode));
  return s;
}

std::shared_ptr<Module> Conv2d::replicate() const {
  Generator unused;
  return std::make_shared<Conv2d>(in_channels, out_channels, kernel_size, options, unused);
}

namespace functional {

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
              Conv2dPadding padding, Size2 stride, Size2 dilation, int64_t groups) {
  check_padding("conv2d", padding, stride);
  LOCKSTEP_CHECK(weight.dim() == 4, "conv2d: weight must be [C_out, C_in / groups, kH, kW], got {}",
                 runtime::shape_str(weight.shape()));
  const Size2 kernel(weight.size(2), weight.size(3));
  return padded_conv2d(input, weight, bias, padding.amounts(kernel, dilation), PadMode::zeros,
                       stride, dilation, groups);
}

}  // namespace functional

}  // namespace lockstep::nn
