#include "lockstep/nn/conv.h"

#include <cmath>

#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops.h"

namespace lockstep::nn {

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
  LOCKSTEP_CHECK(opts.padding.h >= 0 && opts.padding.w >= 0,
                 "Conv2d: padding must be non-negative, got {}", opts.padding.str());
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

Tensor Conv2d::forward(const Tensor& x) {
  LOCKSTEP_CHECK(x.dim() == 4 && x.size(1) == in_channels,
                 "Conv2d({}, {}): expected input [N, {}, H, W], got {}", in_channels, out_channels,
                 in_channels, runtime::shape_str(x.shape()));
  return runtime::conv2d(x, weight, bias,
                         runtime::Conv2dOptions{.stride = options.stride.arr(),
                                                .padding = options.padding.arr(),
                                                .dilation = options.dilation.arr(),
                                                .groups = options.groups});
}

std::string Conv2d::extra_repr() const {
  // PyTorch prints stride always and the rest only when not the default.
  std::string s = fmt::format("{}, {}, kernel_size={}, stride={}", in_channels, out_channels,
                              kernel_size.str(), options.stride.str());
  if (options.padding != Size2(0)) s += ", padding=" + options.padding.str();
  if (options.dilation != Size2(1)) s += ", dilation=" + options.dilation.str();
  if (options.groups != 1) s += fmt::format(", groups={}", options.groups);
  if (!options.bias) s += ", bias=false";
  return s;
}

std::shared_ptr<Module> Conv2d::replicate() const {
  Generator unused;
  return std::make_shared<Conv2d>(in_channels, out_channels, kernel_size, options, unused);
}

}  // namespace lockstep::nn
