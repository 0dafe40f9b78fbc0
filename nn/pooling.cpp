#include "lockstep/nn/pooling.h"

#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops.h"

namespace lockstep::nn {

namespace {

Size2 resolve_stride(const char* layer, Size2 kernel, Size2 stride, Size2 padding) {
  LOCKSTEP_CHECK(kernel.h > 0 && kernel.w > 0, "{}: kernel_size must be positive, got {}", layer,
                 kernel.str());
  LOCKSTEP_CHECK(stride.h >= 0 && stride.w >= 0, "{}: stride must be positive, got {}", layer,
                 stride.str());
  // As PyTorch: padding at most half the kernel, so every window sees input.
  LOCKSTEP_CHECK(padding.h >= 0 && padding.w >= 0 && 2 * padding.h <= kernel.h &&
                     2 * padding.w <= kernel.w,
                 "{}: padding {} must be non-negative and at most half of kernel_size {}", layer,
                 padding.str(), kernel.str());
  return {stride.h == 0 ? kernel.h : stride.h, stride.w == 0 ? kernel.w : stride.w};
}

runtime::Pool2dOptions pool_options(Size2 kernel, Size2 stride, Size2 padding, bool ceil_mode) {
  return {.kernel = kernel.arr(),
          .stride = stride.arr(),
          .padding = padding.arr(),
          .ceil_mode = ceil_mode};
}

}  // namespace

MaxPool2d::MaxPool2d(Size2 k, Size2 s, Size2 p, bool ceil)
    : kernel_size(k), stride(resolve_stride("MaxPool2d", k, s, p)), padding(p), ceil_mode(ceil) {}

Tensor MaxPool2d::forward(const Tensor& x) {
  return runtime::max_pool2d(x, pool_options(kernel_size, stride, padding, ceil_mode));
}

// PyTorch prints MaxPool2d's ceil_mode (not AvgPool2d's); here only when set.
std::string MaxPool2d::extra_repr() const {
  return fmt::format("kernel_size={}, stride={}, padding={}{}", kernel_size.short_str(),
                     stride.short_str(), padding.short_str(), ceil_mode ? ", ceil_mode=true" : "");
}

AvgPool2d::AvgPool2d(Size2 k, Size2 s, Size2 p, bool ceil)
    : kernel_size(k), stride(resolve_stride("AvgPool2d", k, s, p)), padding(p), ceil_mode(ceil) {}

Tensor AvgPool2d::forward(const Tensor& x) {
  return runtime::avg_pool2d(x, pool_options(kernel_size, stride, padding, ceil_mode));
}

std::string AvgPool2d::extra_repr() const {
  return fmt::format("kernel_size={}, stride={}, padding={}", kernel_size.short_str(),
                     stride.short_str(), padding.short_str());
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) {
  return runtime::adaptive_avg_pool2d(x, output_size.arr());
}

std::string AdaptiveAvgPool2d::extra_repr() const {
  return "output_size=" + output_size.short_str();
}

std::shared_ptr<Module> MaxPool2d::replicate() const {
  return std::make_shared<MaxPool2d>(kernel_size, stride, padding, ceil_mode);
}
std::shared_ptr<Module> AvgPool2d::replicate() const {
  return std::make_shared<AvgPool2d>(kernel_size, stride, padding, ceil_mode);
}
std::shared_ptr<Module> AdaptiveAvgPool2d::replicate() const {
  return std::make_shared<AdaptiveAvgPool2d>(output_size);
}

}  // namespace lockstep::nn
