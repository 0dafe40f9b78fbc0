#include "lockstep/nn/checkpoint.h"

#include <utility>
#include <vector>

#include "lockstep/runtime/autograd/checkpoint.h"

namespace lockstep::nn {

Checkpoint::Checkpoint(std::shared_ptr<Module> wrapped) {
  register_module("module", std::move(wrapped), module);
}

Tensor Checkpoint::forward(const Tensor& input) {
  return runtime::checkpoint([m = module](const Tensor& x) { return m->forward(x); }, input);
}

// The tensors go through the region; everything else is captured as it is.
// The first run (the forward) notes where the results' tensors are.
Values Checkpoint::forward_values(const Values& inputs) {
  std::vector<Value> args(inputs.begin(), inputs.end());
  std::vector<size_t> tensor_at;
  std::vector<Tensor> tensors;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!inputs.is_tensor(i)) continue;
    tensor_at.push_back(i);
    tensors.push_back(inputs.tensor(i));
    args[i] = Value{};
  }
  auto results = std::make_shared<std::vector<Value>>();
  auto fn = [m = module, args, tensor_at, results,
             first = std::make_shared<bool>(true)](const std::vector<Tensor>& in) {
    std::vector<Value> call = args;
    for (size_t k = 0; k < tensor_at.size(); ++k) call[tensor_at[k]] = in[k];
    const Values out = m->forward_values(Values(std::move(call)));
    if (*first) {
      results->assign(out.begin(), out.end());
      *first = false;
    }
    return out.tensors();
  };
  const std::vector<Tensor> outs = runtime::checkpoint(fn, tensors);
  std::vector<Value> values = std::move(*results);
  size_t next = 0;
  for (Value& v : values) {
    if (const Tensor* t = std::get_if<Tensor>(&v); t != nullptr && t->defined()) v = outs[next++];
  }
  return Values(std::move(values));
}

std::shared_ptr<Module> Checkpoint::replicate() const {
  return std::make_shared<Checkpoint>(module->replicate());
}

}  // namespace lockstep::nn
