// Sequential: runs its children in order; they are named "0", "1", ... so
// parameter names match a PyTorch nn.Sequential of the same layers. Through
// forward_values, each child's outputs are the next one's inputs.
#pragma once

#include <initializer_list>
#include <memory>

#include "lockstep/nn/module.h"
#include "lockstep/runtime/error.h"

namespace lockstep::nn {

class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);

  // Appends under the next index and returns the same (typed) pointer.
  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    return register_module(std::to_string(size()), std::move(module));
  }

  Tensor forward(const Tensor& input) override;
  Values forward_values(const Values& inputs) override;
  std::string type_name() const override { return "Sequential"; }
  std::shared_ptr<Module> replicate() const override;

  size_t size() const { return child_list().size(); }
  std::shared_ptr<Module> operator[](size_t i) const;
  // The i-th module as an M; an error if it is another type.
  template <class M>
  std::shared_ptr<M> at(size_t i) const;

};

// Named children and no computation of its own, as nn.ModuleDict: groups
// submodules under a prefix ("transformer.wte.weight").
class ModuleDict : public Module {
 public:
  template <class M>
  std::shared_ptr<M> insert(std::string name, std::shared_ptr<M> module) {
    return register_module(std::move(name), std::move(module));
  }
  std::string type_name() const override { return "ModuleDict"; }
  std::shared_ptr<Module> replicate() const override;
};

template <class M>
std::shared_ptr<M> Sequential::at(size_t i) const {
  auto m = std::dynamic_pointer_cast<M>((*this)[i]);
  LOCKSTEP_CHECK(m != nullptr, "Sequential::at({}): the module there is a {}", i,
                 (*this)[i]->type_name());
  return m;
}

}  // namespace lockstep::nn
