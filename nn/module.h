// Module: the base of every layer and model, as torch.nn.Module.
//
// A module owns named parameters, buffers and submodules, each registered
// once in a stable order. That order is the contract the rest of the system
// builds on: named_parameters() gives the same names in the same order on
// every rank (DDP checks shapes and assigns buckets with it), and
// state_dict() uses PyTorch's names and order (per module: its parameters,
// its buffers, then each submodule), so weights can be copied to and from an
// identical PyTorch model by name. Modules are used through std::shared_ptr
// and are not copyable: tensors are shared handles, and a copied module would
// silently share its parameters.
#pragma once

#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "lockstep/nn/state_dict.h"
#include "lockstep/nn/values.h"
#include "lockstep/runtime/random.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::nn {

using runtime::Device;
using runtime::DType;
using runtime::Generator;
using runtime::Shape;
using runtime::Tensor;

template <class T>
using NamedList = std::vector<std::pair<std::string, T>>;

// What load_state_dict(strict = false) skipped, as PyTorch's _IncompatibleKeys.
struct LoadResult {
  std::vector<std::string> missing_keys;     // in the model, not in the dict
  std::vector<std::string> unexpected_keys;  // in the dict, not in the model
};

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The computation. A module overrides one of the two forwards: the first
  // for one tensor in and one out (most layers), the second for several
  // inputs or outputs (nn/values.h). Each one's default calls the other: a
  // module with only forward_values can still be called with one tensor
  // (when it returns one), and one with only forward(Tensor) through
  // forward_values with one tensor, which is how DDP and DataParallel pass
  // any call through. A module that overrides neither throws.
  virtual Tensor forward(const Tensor& input);
  virtual Values forward_values(const Values& inputs);
  Tensor operator()(const Tensor& input) { return forward(input); }
  Values operator()(const Values& inputs) { return forward_values(inputs); }

  // ---- registration (names: non-empty, no '.', unique within the module) ----
  // Sets requires_grad on `value` and returns it (the same shared handle).
  Tensor register_parameter(std::string name, Tensor value, bool requires_grad = true);
  // Non-persistent buffers are moved by to() but left out of state_dict().
  Tensor register_buffer(std::string name, Tensor value, bool persistent = true);
  template <class M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module);
  // Puts `module` where the submodule `name` was, at the same position, so
  // names and state_dict order stay (convert_sync_batchnorm uses it). A module
  // that kept its own pointer to the old child still calls the old one.
  void replace_child(const std::string& name, std::shared_ptr<Module> module);

  // ---- queries; recursive names are dotted ("0.weight"), pre-order ----
  // A tensor shared by two modules is listed once, under its first name.
  NamedList<Tensor> named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  NamedList<Tensor> named_buffers(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  NamedList<std::shared_ptr<Module>> named_children() const;
  std::vector<std::shared_ptr<Module>> children() const;
  // This module (name "") and every descendant; pointers live as long as the tree.
  NamedList<Module*> named_modules();
  // Calls fn on every descendant, then on this module (PyTorch's apply order).
  void apply(const std::function<void(Module&)>& fn);
  int64_t num_parameters() const;  // total elements over parameters()

  // ---- state ----
  // Parameters and persistent buffers, detached handles that share storage
  // with the model (save them, or clone them to keep a snapshot).
  StateDict state_dict() const;
  // Copies values in place under no-grad (dtype converted). Checks first and
  // copies nothing on error: one Error lists every shape mismatch and, when
  // strict, every missing and unexpected key.
  LoadResult load_state_dict(const StateDict& dict, bool strict = true);

  // ---- mode, device, gradients ----
  virtual void train(bool on = true);  // recursive
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves parameters, buffers and gradients; tensors keep their identity
  // (like PyTorch's param.data = ...), so optimizers built earlier stay valid.
  Module& to(Device device);
  // Converts floating-point parameters and buffers only (counters stay i64).
  Module& to(DType dtype);
  // Drops every parameter's gradient (PyTorch's set_to_none=True default).
  void zero_grad();

  // ---- replication (nn::DataParallel) ----
  // A new module of the same type and configuration with tensors of its own
  // (their values unspecified: DataParallel copies this module's in before
  // each forward), its submodules replicated too, so that named_parameters()
  // and named_buffers() list the same names in the same order. Every built-in
  // module has one; a module of your own needs one to be wrapped by
  // DataParallel (the base class throws, naming the type), as libtorch's
  // Cloneable. Draws no random numbers from the default generator.
  virtual std::shared_ptr<Module> replicate() const;

  // ---- printing, in PyTorch's format ----
  virtual std::string type_name() const { return "Module"; }
  virtual std::string extra_repr() const { return ""; }
  std::string str() const;

 protected:
  void check_new_name(const std::string& name, const char* what) const;
  // The direct children in registration order, without copying.
  const NamedList<std::shared_ptr<Module>>& child_list() const { return children_; }

 private:
  struct Slot {
    std::string name;
    Tensor value;
    bool persistent = true;
  };
  void add_child(std::string name, std::shared_ptr<Module> module);
  void collect_state(const std::string& prefix, StateDict& out) const;
  template <class Fn>
  void for_each_tensor(Fn&& fn);  // fn(Tensor&) for every parameter and buffer

  std::vector<Slot> params_;
  std::vector<Slot> buffers_;
  NamedList<std::shared_ptr<Module>> children_;
  bool training_ = true;
};

std::ostream& operator<<(std::ostream& os, const Module& m);

template <class M>
std::shared_ptr<M> Module::register_module(std::string name, std::shared_ptr<M> module) {
  static_assert(std::is_base_of_v<Module, M>, "register_module: M must derive from nn::Module");
  add_child(std::move(name), module);
  return module;
}

}  // namespace lockstep::nn
