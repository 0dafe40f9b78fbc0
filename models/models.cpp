#include "lockstep/models/models.h"

#include "lockstep/nn/activation.h"
#include "lockstep/nn/conv.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/normalization.h"
#include "lockstep/nn/pooling.h"

namespace lockstep::models {

using namespace nn;

std::shared_ptr<Sequential> fashion_mlp(Generator& gen) {
  auto m = std::make_shared<Sequential>();
  m->push_back(std::make_shared<Flatten>());
  m->push_back(std::make_shared<Linear>(784, 1024, true, gen));
  m->push_back(std::make_shared<ReLU>());
  m->push_back(std::make_shared<Linear>(1024, 1024, true, gen));
  m->push_back(std::make_shared<ReLU>());
  m->push_back(std::make_shared<Linear>(1024, 10, true, gen));
  return m;
}

std::shared_ptr<Sequential> fashion_mlp(uint64_t seed) {
  Generator gen(seed);
  return fashion_mlp(gen);
}

std::shared_ptr<Sequential> fashion_cnn(Generator& gen) {
  const Conv2dOptions pad1{.padding = 1};
  auto m = std::make_shared<Sequential>();
  m->push_back(std::make_shared<Conv2d>(1, 32, 3, pad1, gen));
  m->push_back(std::make_shared<BatchNorm2d>(32));
  m->push_back(std::make_shared<ReLU>());
  m->push_back(std::make_shared<MaxPool2d>(2));
  m->push_back(std::make_shared<Conv2d>(32, 64, 3, pad1, gen));
  m->push_back(std::make_shared<BatchNorm2d>(64));
  m->push_back(std::make_shared<ReLU>());
  m->push_back(std::make_shared<MaxPool2d>(2));
  m->push_back(std::make_shared<Flatten>());
  m->push_back(std::make_shared<Linear>(64 * 7 * 7, 128, true, gen));
  m->push_back(std::make_shared<ReLU>());
  m->push_back(std::make_shared<Linear>(128, 10, true, gen));
  return m;
}

std::shared_ptr<Sequential> fashion_cnn(uint64_t seed) {
  Generator gen(seed);
  return fashion_cnn(gen);
}

std::shared_ptr<ResNet> resnet18_cifar(Generator& gen) {
  return std::make_shared<ResNet>(std::vector<int64_t>{2, 2, 2, 2}, 10, gen);
}

std::shared_ptr<ResNet> resnet18_cifar(uint64_t seed) {
  Generator gen(seed);
  return resnet18_cifar(gen);
}

std::shared_ptr<Gpt> gpt(const GptConfig& config, Generator& gen) {
  return std::make_shared<Gpt>(config, gen);
}

std::shared_ptr<Gpt> gpt(const GptConfig& config, uint64_t seed) {
  Generator gen(seed);
  return gpt(config, gen);
}

}  // namespace lockstep::models
