// ResNet for 32x32 inputs (CIFAR-style: a 3x3 stem, no max-pool), built from
// BasicBlocks. Parameter names are torchvision's ("conv1.weight",
// "layer2.0.downsample.0.weight", "fc.bias"), so a PyTorch twin with the same
// attribute names (benchmarks/step_bench_torch.py) matches name for name.
// Each layer starts as PyTorch's default nn.Conv2d / nn.Linear / BatchNorm2d
// does (kaiming_uniform_ with a = sqrt(5); weight 1, bias 0), not with
// torchvision's kaiming_normal_(mode="fan_out") for the convolutions.
#pragma once

#include <memory>
#include <vector>

#include "lockstep/nn/container.h"
#include "lockstep/nn/conv.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/normalization.h"

namespace lockstep::models {

// relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)). conv1 is 3x3 with
// `stride`, conv2 3x3 stride 1, both without bias (the batch norm has one).
// The shortcut is the identity, or, when the stride or the channel count
// changes, `downsample` = Sequential(Conv2d 1x1 with `stride`, BatchNorm2d).
class BasicBlock : public nn::Module {
 public:
  BasicBlock(int64_t in_channels, int64_t channels, int64_t stride,
             runtime::Generator& gen = runtime::default_generator());
  runtime::Tensor forward(const runtime::Tensor& input) override;
  std::string type_name() const override { return "BasicBlock"; }
  std::shared_ptr<nn::Module> replicate() const override;

  // Bound to the registered children (nn::Module::bind_child): replace_child
  // points them at the new module, which must be of the field's type, so a
  // BatchNorm may become a SyncBatchNorm (convert_sync_batchnorm).
  std::shared_ptr<nn::Conv2d> conv1, conv2;
  std::shared_ptr<nn::BatchNormBase> bn1, bn2;
  std::shared_ptr<nn::Sequential> downsample;  // null for the identity shortcut
};

// Input [N, 3, H, W] -> logits [N, num_classes] (with conv1 replaced, as
// replace_child("conv1", Conv2d(1, 64, ...)) for grey images, [N, C, H, W] for
// the C channels conv1 takes):
//   conv1 (3x3, 64, stride 1, no bias), bn1, relu,
//   layer1..layer4: blocks_per_stage[i] BasicBlocks of 64/128/256/512
//   channels, the first block of layers 2-4 with stride 2,
//   adaptive average pool to 1x1, flatten, fc = Linear(512, num_classes).
class ResNet : public nn::Module {
 public:
  ResNet(const std::vector<int64_t>& blocks_per_stage, int64_t num_classes,
         runtime::Generator& gen = runtime::default_generator());
  runtime::Tensor forward(const runtime::Tensor& input) override;
  std::string type_name() const override { return "ResNet"; }
  std::shared_ptr<nn::Module> replicate() const override;

  // Bound to the registered children, as BasicBlock's.
  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNormBase> bn1;
  std::vector<std::shared_ptr<nn::Sequential>> layers;  // layer1..layer4
  std::shared_ptr<nn::Linear> fc;
};

}  // namespace lockstep::models
