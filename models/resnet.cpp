#include "lockstep/models/resnet.h"

#include <string>

#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops.h"

namespace lockstep::models {

using namespace nn;

namespace {

Conv2dOptions conv_options(int64_t stride, int64_t padding) {
  return {.stride = stride, .padding = padding, .bias = false};
}

}  // namespace

// Registration order is torchvision's: conv1, bn1, conv2, bn2, downsample.
BasicBlock::BasicBlock(int64_t in_channels, int64_t channels, int64_t stride, Generator& gen) {
  LOCKSTEP_CHECK(stride > 0, "BasicBlock: stride must be positive, got {}", stride);
  register_module("conv1",
                  std::make_shared<Conv2d>(in_channels, channels, 3, conv_options(stride, 1), gen),
                  conv1);
  register_module("bn1", std::make_shared<BatchNorm2d>(channels), bn1);
  register_module("conv2",
                  std::make_shared<Conv2d>(channels, channels, 3, conv_options(1, 1), gen), conv2);
  register_module("bn2", std::make_shared<BatchNorm2d>(channels), bn2);
  if (stride != 1 || in_channels != channels) {
    auto shortcut = std::make_shared<Sequential>();
    shortcut->push_back(
        std::make_shared<Conv2d>(in_channels, channels, 1, conv_options(stride, 0), gen));
    shortcut->push_back(std::make_shared<BatchNorm2d>(channels));
    register_module("downsample", shortcut, downsample);
  }
}

Tensor BasicBlock::forward(const Tensor& x) {
  Tensor out = runtime::relu((*bn1)((*conv1)(x)));
  out = (*bn2)((*conv2)(out));
  return runtime::relu(out + (downsample ? (*downsample)(x) : x));
}

ResNet::ResNet(const std::vector<int64_t>& blocks_per_stage, int64_t num_classes, Generator& gen) {
  LOCKSTEP_CHECK(blocks_per_stage.size() == 4,
                 "ResNet: expected blocks for 4 stages, got {} numbers", blocks_per_stage.size());
  LOCKSTEP_CHECK(num_classes > 0, "ResNet: num_classes must be positive, got {}", num_classes);
  register_module("conv1", std::make_shared<Conv2d>(3, 64, 3, conv_options(1, 1), gen), conv1);
  register_module("bn1", std::make_shared<BatchNorm2d>(64), bn1);
  int64_t in_channels = 64;
  for (size_t stage = 0; stage < 4; ++stage) {
    LOCKSTEP_CHECK(blocks_per_stage[stage] > 0, "ResNet: stage {} needs at least one block",
                   stage + 1);
    const int64_t channels = int64_t{64} << stage;
    auto layer = std::make_shared<Sequential>();
    for (int64_t b = 0; b < blocks_per_stage[stage]; ++b) {
      const int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
      layer->push_back(std::make_shared<BasicBlock>(in_channels, channels, stride, gen));
      in_channels = channels;
    }
    const std::string name = "layer" + std::to_string(stage + 1);
    layers.push_back(register_module(name, layer));
    bind_child<Sequential>(name, [this, stage](std::shared_ptr<Sequential> m) {
      layers.at(stage) = std::move(m);
    });
  }
  register_module("fc", std::make_shared<Linear>(in_channels, num_classes, true, gen), fc);
}

Tensor ResNet::forward(const Tensor& x) {
  // The channels of conv1 as it is now: a stem replaced for other images
  // (model.conv1 = nn.Conv2d(1, 64, ...) in PyTorch) takes what it was built for.
  const int64_t channels = conv1->in_channels;
  LOCKSTEP_CHECK(x.dim() == 4 && x.size(1) == channels,
                 "ResNet: expected input [N, {}, H, W] (the channels conv1 takes), got {}",
                 channels, runtime::shape_str(x.shape()));
  Tensor out = runtime::relu((*bn1)((*conv1)(x)));
  for (const auto& layer : layers) out = (*layer)(out);
  out = runtime::adaptive_avg_pool2d(out, {1, 1}).flatten(1);
  return (*fc)(out);
}

std::shared_ptr<Module> BasicBlock::replicate() const {
  Generator unused;
  return std::make_shared<BasicBlock>(conv1->in_channels, conv1->out_channels,
                                      conv1->options.stride.h, unused);
}
std::shared_ptr<Module> ResNet::replicate() const {
  std::vector<int64_t> blocks_per_stage;
  for (const auto& layer : layers) blocks_per_stage.push_back(static_cast<int64_t>(layer->size()));
  Generator unused;
  return std::make_shared<ResNet>(blocks_per_stage, fc->out_features, unused);
}

}  // namespace lockstep::models
