// The models the examples and benchmarks use. The two Fashion-MNIST models are
// nn::Sequential, so their parameter names ("1.weight", "4.running_mean", ...)
// are those of a PyTorch nn.Sequential with the same layers; the ResNet's are
// torchvision's. The step benchmark builds each twin in PyTorch, so weights
// can be copied across by name.
#pragma once

#include <cstdint>
#include <memory>

#include "lockstep/models/gpt.h"
#include "lockstep/models/resnet.h"
#include "lockstep/nn/container.h"

namespace lockstep::models {

// Input [N, 1, 28, 28] (or [N, 784]) -> logits [N, 10]:
// Flatten, Linear(784, 1024), ReLU, Linear(1024, 1024), ReLU, Linear(1024, 10).
// 1,863,690 parameters.
std::shared_ptr<nn::Sequential> fashion_mlp(runtime::Generator& gen = runtime::default_generator());
std::shared_ptr<nn::Sequential> fashion_mlp(uint64_t seed);

// Input [N, 1, 28, 28] -> logits [N, 10]:
//  0 Conv2d(1, 32, 3, padding 1)   1 BatchNorm2d(32)  2 ReLU  3 MaxPool2d(2)
//  4 Conv2d(32, 64, 3, padding 1)  5 BatchNorm2d(64)  6 ReLU  7 MaxPool2d(2)
//  8 Flatten  9 Linear(3136, 128)  10 ReLU  11 Linear(128, 10).
// 421,834 parameters.
std::shared_ptr<nn::Sequential> fashion_cnn(runtime::Generator& gen = runtime::default_generator());
std::shared_ptr<nn::Sequential> fashion_cnn(uint64_t seed);

// ResNet-18 for 32x32 inputs (CIFAR-10): input [N, 3, 32, 32] -> logits
// [N, 10]. A 3x3 stem without max-pool, 2 BasicBlocks per stage (resnet.h).
// 11,173,962 parameters.
std::shared_ptr<ResNet> resnet18_cifar(runtime::Generator& gen = runtime::default_generator());
std::shared_ptr<ResNet> resnet18_cifar(uint64_t seed);

// A GPT (models/gpt.h): GptConfig::gpt2() is GPT-2's 124M model
// (124,439,808 parameters); the gpt example trains small ones on the CPU.
std::shared_ptr<Gpt> gpt(const GptConfig& config, runtime::Generator& gen = runtime::default_generator());
std::shared_ptr<Gpt> gpt(const GptConfig& config, uint64_t seed);

}  // namespace lockstep::models
