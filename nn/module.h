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
#include <typeinfo>
#include <unordered_set>
#include <utility>
#include <vector>

#include "lockstep/nn/state_dict.h"
#include "lockstep/nn/values.h"
#include "lockstep/runtime/error.h"
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
  // `value` must be a leaf (no grad_fn), as PyTorch's Parameter.
  Tensor register_parameter(std::string name, Tensor value, bool requires_grad = true);
  // Non-persistent buffers are moved by to() but left out of state_dict().
  Tensor register_buffer(std::string name, Tensor value, bool persistent = true);
  // A module may not contain itself: `module` must not be this module nor
  // have it among its descendants (the recursive walks would never end).
  template <class M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module);
  // Puts `module` where the submodule `name` was, at the same position, so
  // names and state_dict order stay (convert_sync_batchnorm uses it). Fields
  // bound to that child (bind_child below: every built-in module's typed
  // pointers, such as ResNet's bn1) are pointed at the new module, which must
  // then be of the field's type: a module of another kind is refused with an
  // error naming both, and nothing changes.
  void replace_child(const std::string& name, std::shared_ptr<Module> module);

  // ---- queries; recursive names are dotted ("0.weight"), pre-order ----
  // A tensor shared by two modules is listed once, under its first name.
  NamedList<Tensor> named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  NamedList<Tensor> named_buffers(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  // The direct children, each module once (under its first name), as PyTorch's.
  NamedList<std::shared_ptr<Module>> named_children() const;
  std::vector<std::shared_ptr<Module>> children() const;
  // Every registered child entry in order, without copying: a module
  // registered under two names is listed under both.
  const NamedList<std::shared_ptr<Module>>& child_list() const { return children_; }
  // The direct child `name` as an M; an error when there is none of that
  // name or it is not an M.
  template <class M = Module>
  std::shared_ptr<M> child(const std::string& name) const;
  // Makes replace_child(name, m) refuse an m that is not an F, naming `user`:
  // for a module that calls a grandchild through this one as an F (GPT's
  // transformer.wte). The current child must be an F.
  template <class F>
  void require_child_type(const std::string& name, const std::string& user);
  // This module (name "") and every descendant; pointers live as long as the tree.
  NamedList<Module*> named_modules();
  // Calls fn on every descendant, then on this module (PyTorch's apply order:
  // children first, post-order). Each module once, even one registered
  // twice or shared by two parents.
  void apply(const std::function<void(Module&)>& fn);
  int64_t num_parameters() const;  // total elements over parameters()
  // One number per module of named_modules(), in that order, that changes
  // whenever the module gains a parameter or a child or swaps a child
  // (register_parameter, register_module, replace_child) and is never reused
  // by another module: an equal list means the same tree of the same modules
  // with the same parameters. DataParallel compares it to know when its
  // cached replicas must be made again, DDP to refuse a model changed after
  // wrapping.
  std::vector<uint64_t> structure_stamps() const;
  // As structure_stamps(), changing whenever the module gains a buffer
  // (register_buffer): DataParallel's replicas carry copies of the buffers,
  // DDP broadcasts the ones the model has at each forward.
  std::vector<uint64_t> buffer_stamps() const;

  // ---- state ----
  // Parameters and persistent buffers, detached handles that share storage
  // with the model (save them, or clone them to keep a snapshot).
  StateDict state_dict() const;
  // Copies values in place under no-grad (dtype converted). Checks first and
  // copies nothing on error: one Error lists every shape mismatch and, when
  // strict, every missing and unexpected key. A tensor the model holds under
  // several names (tied weights) loads from any one of them, and the others
  // are not missing; different values under two of them are an error.
  LoadResult load_state_dict(const StateDict& dict, bool strict = true);
  // load_state_dict's checks alone: throws the error it would throw, and
  // otherwise returns what it would skip. Changes nothing; a caller that
  // must change several objects together checks each before changing any.
  LoadResult check_state_dict(const StateDict& dict, bool strict = true) const;
  // This module's own persistent buffers that a state_dict may leave out:
  // load_state_dict then keeps their values and does not count them missing.
  // BatchNorm's num_batches_tracked, as PyTorch loads it (PyTorch before
  // 0.4.1 did not save it, and files converted from such weights lack it).
  virtual std::vector<std::string> optional_state() const { return {}; }

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

  // ---- typed pointers to children (fields a forward() calls) ----
  // A module that keeps its own typed pointer to a child, to call it or to
  // let users reach it (ResNet's bn1, Checkpoint's module), binds that field
  // to the child, so that replace_child(name, m) points the field at m too;
  // an unbound field would keep calling the old child, whose parameters are
  // no longer in parameters(). The bound field's type is what replace_child
  // requires of m.
  //
  //   bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(c));
  //   bind_child("bn1", bn1);     // or register_module("bn1", ..., bn1)
  //
  // `field` must be a member of this module (it is written through this
  // module's lifetime). The child's current module is checked and stored now.
  template <class F>
  void bind_child(const std::string& name, std::shared_ptr<F>& field);
  // The same with a setter, for a field that is not a plain member (an
  // element of a vector): `set` receives the child, already checked to be an F.
  template <class F>
  void bind_child(const std::string& name, std::function<void(std::shared_ptr<F>)> set);
  // Registers and binds in one call.
  template <class M, class F>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module,
                                     std::shared_ptr<F>& field);
  // Refuses every replace_child(name, ...) with `reason` (for a child the
  // module has built state around that a swap would leave behind).
  void freeze_child(const std::string& name, std::string reason);

 private:
  struct Slot {
    std::string name;
    Tensor value;
    bool persistent = true;
  };
  // What bind_child and freeze_child record for one child: `refuse` returns
  // why a module cannot go there ("" if it can), `set` stores it.
  struct Binding {
    std::string child;
    std::function<std::string(const Module&)> refuse;
    std::function<void(const std::shared_ptr<Module>&)> set;
  };
  void add_child(std::string name, std::shared_ptr<Module> module);
  // An error unless `module` may become a child of this one (not null, not
  // this module or one of its ancestors).
  void check_new_child(const std::string& name, const Module* module, const char* op) const;
  const std::shared_ptr<Module>& find_child(const std::string& name, const char* op) const;
  void add_binding(Binding binding);
  static std::string type_of(const std::type_info& type);
  template <class F>
  static bool is_a(const Module& m) {
    if constexpr (std::is_same_v<F, Module>) {
      return true;
    } else {
      return dynamic_cast<const F*>(&m) != nullptr;
    }
  }
  // "<user> calls this submodule as a <wants>, and the new module, a <m's
  // type>, is not one".
  static std::string not_a(const std::string& user, const std::string& wants, const Module& m);
  void collect_state(const std::string& prefix, StateDict& out) const;
  template <class Fn>
  void for_each_tensor(Fn&& fn);  // fn(Tensor&) for every parameter and buffer

  std::vector<Slot> params_;
  std::vector<Slot> buffers_;
  NamedList<std::shared_ptr<Module>> children_;
  // The names in params_, buffers_ and children_ (registered names stay):
  // check_new_name looks a name up here, not along each list, so a Sequential
  // of n children is built in O(n).
  std::unordered_set<std::string> names_;
  std::vector<Binding> bindings_;
  bool training_ = true;
  uint64_t stamp_ = next_stamp();  // structure_stamps(); new at each child or parameter change
  uint64_t buffer_stamp_ = next_stamp();  // buffer_stamps(); new at each buffer registered
  static uint64_t next_stamp();
};

std::ostream& operator<<(std::ostream& os, const Module& m);

template <class M>
std::shared_ptr<M> Module::register_module(std::string name, std::shared_ptr<M> module) {
  static_assert(std::is_base_of_v<Module, M>, "register_module: M must derive from nn::Module");
  add_child(std::move(name), module);
  return module;
}

template <class M, class F>
std::shared_ptr<M> Module::register_module(std::string name, std::shared_ptr<M> module,
                                           std::shared_ptr<F>& field) {
  static_assert(std::is_base_of_v<F, M>, "register_module: the field cannot hold an M");
  const std::string key = name;
  register_module(std::move(name), module);
  bind_child(key, field);
  return module;
}

template <class F>
void Module::bind_child(const std::string& name, std::shared_ptr<F>& field) {
  bind_child<F>(name, std::function<void(std::shared_ptr<F>)>(
                          [&field](std::shared_ptr<F> m) { field = std::move(m); }));
}

template <class F>
void Module::bind_child(const std::string& name, std::function<void(std::shared_ptr<F>)> set) {
  static_assert(std::is_base_of_v<Module, F>, "bind_child: F must derive from nn::Module");
  const std::string wants = type_of(typeid(F));
  Binding b{name,
            [this, wants](const Module& m) -> std::string {
              if (is_a<F>(m)) return "";
              return not_a(type_name(), wants, m);
            },
            [set = std::move(set)](const std::shared_ptr<Module>& m) {
              set(std::dynamic_pointer_cast<F>(m));
            }};
  add_binding(std::move(b));
}

template <class F>
void Module::require_child_type(const std::string& name, const std::string& user) {
  static_assert(std::is_base_of_v<Module, F>, "require_child_type: F must derive from nn::Module");
  const std::string wants = type_of(typeid(F));
  Binding b{name,
            [user, wants](const Module& m) -> std::string {
              if (is_a<F>(m)) return "";
              return not_a(user, wants, m);
            },
            [](const std::shared_ptr<Module>&) {}};
  add_binding(std::move(b));
}

template <class M>
std::shared_ptr<M> Module::child(const std::string& name) const {
  const std::shared_ptr<Module>& m = find_child(name, "child");
  auto typed = std::dynamic_pointer_cast<M>(m);
  if (typed == nullptr)
    throw Error(type_name() + ": child(\"" + name + "\") is a " + m->type_name() + ", not a " +
                type_of(typeid(M)));
  return typed;
}

}  // namespace lockstep::nn
