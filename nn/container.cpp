#include "lockstep/nn/container.h"

namespace lockstep::nn {

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) {
  for (const auto& m : modules) push_back(m);
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& [name, m] : child_list()) x = m->forward(x);
  return x;
}

Values Sequential::forward_values(const Values& inputs) {
  Values x = inputs;
  for (const auto& [name, m] : child_list()) x = m->forward_values(x);
  return x;
}

std::shared_ptr<Module> Sequential::operator[](size_t i) const {
  LOCKSTEP_CHECK(i < size(), "Sequential: index {} is out of range for {} modules", i, size());
  return child_list()[i].second;
}

std::shared_ptr<Module> Sequential::replicate() const {
  auto copy = std::make_shared<Sequential>();
  for (const auto& child : child_list()) copy->push_back(child.second->replicate());
  return copy;
}

std::shared_ptr<Module> ModuleDict::replicate() const {
  auto copy = std::make_shared<ModuleDict>();
  for (const auto& [name, child] : child_list()) copy->insert(name, child->replicate());
  return copy;
}

}  // namespace lockstep::nn
