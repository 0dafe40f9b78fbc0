// 2-D pooling layers over NCHW input.
#pragma once

#include "lockstep/nn/module.h"
#include "lockstep/nn/size2.h"

namespace lockstep::nn {

// stride 0 means "same as the kernel", PyTorch's stride=None default.
// ceil_mode rounds the output size up, as PyTorch's (runtime/ops/pool.h).
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Size2 kernel_size, Size2 stride = 0, Size2 padding = 0,
                     bool ceil_mode = false);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "MaxPool2d"; }
  std::shared_ptr<Module> replicate() const override;
  std::string extra_repr() const override;

  const Size2 kernel_size, stride, padding;  // stride already resolved
  const bool ceil_mode;
};

// Padding counts towards the divisor (count_include_pad=True).
class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Size2 kernel_size, Size2 stride = 0, Size2 padding = 0,
                     bool ceil_mode = false);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "AvgPool2d"; }
  std::shared_ptr<Module> replicate() const override;
  std::string extra_repr() const override;

  const Size2 kernel_size, stride, padding;
  const bool ceil_mode;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Size2 output_size) : output_size(output_size) {}
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "AdaptiveAvgPool2d"; }
  std::shared_ptr<Module> replicate() const override;
  std::string extra_repr() const override;

  const Size2 output_size;
};

}  // namespace lockstep::nn
