// Conv2d over NCHW input, initialised as PyTorch's nn.Conv2d.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include "lockstep/nn/module.h"
#include "lockstep/nn/size2.h"
#include "lockstep/runtime/ops/pad.h"

namespace lockstep::nn {

// Conv2d's padding, as PyTorch's: a size (`1`, `{1, 2}`) or "same" / "valid".
// "same" keeps H and W (stride 1 only): dilation * (kernel - 1) zeros per
// dim, half each side, the odd one (an even kernel) on the bottom / right.
// "valid" is no padding.
struct Conv2dPadding {
  enum class Mode { size, same, valid };

  Conv2dPadding(int64_t both) : size(both) {}  // implicit on purpose, as Size2
  Conv2dPadding(int64_t h, int64_t w) : size(h, w) {}
  Conv2dPadding(Size2 s) : size(s) {}
  template <std::size_t N>
  Conv2dPadding(const char (&s)[N]) : Conv2dPadding(std::string_view(s, N - 1)) {}
  // "same" or "valid"; any other string is refused.
  explicit Conv2dPadding(std::string_view mode_name);

  // How PyTorch prints it: "same", "valid" or (h, w).
  std::string str() const;
  // The padding (left, right, top, bottom) for this kernel and dilation.
  std::array<int64_t, 4> amounts(Size2 kernel, Size2 dilation) const;
  bool operator==(const Conv2dPadding&) const = default;

  Mode mode = Mode::size;
  Size2 size = 0;  // Mode::size only
};

using runtime::PadMode;

// Conv2d(1, 32, 3, {.padding = 1}) or {.padding = "same"}. padding_mode is
// PyTorch's: what the padding holds, zeros or (PadMode::reflect, replicate,
// circular) the input's own entries, padded by runtime::pad2d before an
// unpadded conv; reflect needs a padding < the input's H and W, circular <=.
struct Conv2dOptions {
  Size2 stride = 1;
  Conv2dPadding padding = 0;
  Size2 dilation = 1;
  int64_t groups = 1;
  bool bias = true;
  PadMode padding_mode = PadMode::zeros;
};

// Init (nn.Conv2d.reset_parameters): with fan_in = in_channels/groups * kH * kW,
// weight ~ kaiming_uniform(a = sqrt(5)) = U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
// bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)). Weight drawn first.
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, Conv2dOptions options = {},
         Generator& gen = runtime::default_generator());
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Conv2d"; }
  std::shared_ptr<Module> replicate() const override;
  std::string extra_repr() const override;

  const int64_t in_channels;
  const int64_t out_channels;
  const Size2 kernel_size;
  const Conv2dOptions options;
  Tensor weight;  // [out_channels, in_channels / groups, kH, kW]
  Tensor bias;    // [out_channels], undefined without bias
};

}  // namespace lockstep::nn
