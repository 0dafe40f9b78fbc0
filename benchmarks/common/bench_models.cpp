#include "common/bench_models.h"

#include "lockstep/models/models.h"
#include "lockstep/runtime/error.h"

namespace lockstep::bench {

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names{"mlp", "cnn", "resnet18"};
  return names;
}

std::shared_ptr<nn::Module> make_model(const std::string& name, runtime::Generator& gen) {
  if (name == "mlp") return models::fashion_mlp(gen);
  if (name == "cnn") return models::fashion_cnn(gen);
  if (name == "resnet18") return models::resnet18_cifar(gen);
  throw Error(fmt::format("unknown model '{}'; use mlp, cnn or resnet18", name));
}

runtime::Shape input_shape(const std::string& name, int64_t batch) {
  if (name == "resnet18") return {batch, 3, 32, 32};
  return {batch, 1, 28, 28};
}

int64_t default_batch(const std::string& name) {
  if (name == "gpt") return 8;
  return name == "resnet18" ? 256 : 64;
}

models::GptConfig gpt_config(const runtime::Device& device) {
  if (device.is_cuda()) return models::GptConfig::gpt2();
  return {.vocab_size = 256, .block_size = 128, .n_layer = 4, .n_head = 4, .n_embd = 128};
}

}  // namespace lockstep::bench
