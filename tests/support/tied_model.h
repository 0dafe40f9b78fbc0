// A model whose output layer reads its embedding's weight, as GPT's lm_head
// reads wte: ids [rows, 3] in [0, 10) -> logits [rows, 10].
#pragma once

#include <cstdint>
#include <memory>

#include "lockstep/nn/activation.h"
#include "lockstep/nn/container.h"
#include "lockstep/nn/linear.h"
#include "lockstep/runtime/random.h"

namespace lockstep::testing {

inline std::shared_ptr<nn::Sequential> tied_embedding_model(uint64_t seed) {
  runtime::Generator g(seed);
  auto embedding = std::make_shared<nn::Embedding>(10, 4, g);
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(embedding);
  model->push_back(std::make_shared<nn::Flatten>());
  model->push_back(std::make_shared<nn::Linear>(3 * 4, 4, true, g));
  model->push_back(std::make_shared<nn::Linear>(embedding->weight));
  return model;
}

}  // namespace lockstep::testing
