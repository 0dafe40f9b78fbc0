#include "lockstep/nn/module.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <ostream>
#include <sstream>
#include <unordered_set>

#include <cxxabi.h>

#include <fmt/format.h>

#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/autograd/rebind.h"
#include "lockstep/runtime/error.h"

namespace lockstep::nn {

using runtime::NoGradGuard;
using runtime::TensorImpl;

namespace {

// Indents every line but the first by `spaces` (PyTorch's _addindent).
std::string add_indent(const std::string& s, int spaces) {
  std::string pad(static_cast<size_t>(spaces), ' ');
  std::string out;
  for (char c : s) {
    out += c;
    if (c == '\n') out += pad;
  }
  return out;
}

}  // namespace

namespace {

// The module whose default forward is running on this thread: the other
// default finding it there means the subclass overrides neither.
thread_local const Module* defaulting = nullptr;

class Defaulting {
 public:
  explicit Defaulting(const Module* m) : previous_(defaulting) { defaulting = m; }
  ~Defaulting() { defaulting = previous_; }
  Defaulting(const Defaulting&) = delete;
  Defaulting& operator=(const Defaulting&) = delete;

 private:
  const Module* previous_;
};

[[noreturn]] void no_forward(const Module& m) {
  throw Error(fmt::format("{}: has no forward() of its own; override Module::forward (one tensor "
                          "in, one out) or Module::forward_values (several) in the subclass, or "
                          "call the submodules directly",
                          m.type_name()));
}

}  // namespace

Tensor Module::forward(const Tensor& input) {
  if (defaulting == this) no_forward(*this);
  Values out;
  {
    Defaulting guard(this);
    out = forward_values(Values{input});
  }
  LOCKSTEP_CHECK(out.size() == 1 && out.is_tensor(0),
                 "{}: forward(Tensor) needs a module that returns one tensor, but this one "
                 "returned {} values{}; call forward_values() to get them all",
                 type_name(), out.size(), out.size() == 1 ? " (" + describe(out[0]) + ")" : "");
  return out.tensor(0);
}

Values Module::forward_values(const Values& inputs) {
  if (defaulting == this) no_forward(*this);
  LOCKSTEP_CHECK(inputs.size() == 1 && inputs.is_tensor(0),
                 "{}: takes one tensor (it overrides only forward(Tensor)), but was called with "
                 "{} values{}",
                 type_name(), inputs.size(),
                 inputs.size() == 1 ? " (" + describe(inputs[0]) + ")" : "");
  Defaulting guard(this);
  return Values{forward(inputs.tensor(0))};
}

void Module::check_new_name(const std::string& name, const char* what) const {
  LOCKSTEP_CHECK(!name.empty(), "{}: {} name must not be empty", type_name(), what);
  LOCKSTEP_CHECK(name.find('.') == std::string::npos,
                 "{}: {} name \"{}\" must not contain \".\" (dots separate the levels of the "
                 "module tree in state_dict names)",
                 type_name(), what, name);
  LOCKSTEP_CHECK(!names_.contains(name),
                 "{}: a parameter, buffer or submodule named \"{}\" is already registered",
                 type_name(), name);
}

Tensor Module::register_parameter(std::string name, Tensor value, bool requires_grad) {
  check_new_name(name, "parameter");
  LOCKSTEP_CHECK(value.defined(), "{}: parameter \"{}\" is an undefined tensor", type_name(), name);
  // As PyTorch: a parameter computed from other tensors would never hold a
  // gradient of its own, so optimizers and DDP could not train it.
  LOCKSTEP_CHECK(value.is_leaf(),
                 "{}: parameter \"{}\" is not a leaf tensor (it was computed from tensors that "
                 "require grad, and has a grad_fn); register a tensor of its own (a "
                 "detach().clone() of it), or compute the value in forward()",
                 type_name(), name);
  LOCKSTEP_CHECK(!requires_grad || runtime::is_floating(value.dtype()),
                 "{}: parameter \"{}\" is {}, and only floating-point tensors can require grad; "
                 "register it with requires_grad false, or as a buffer",
                 type_name(), name, runtime::dtype_name(value.dtype()));
  value.requires_grad_(requires_grad);
  names_.insert(name);
  params_.push_back({std::move(name), value, true});
  stamp_ = next_stamp();  // a wrapper built before would not average or replicate it
  return value;
}

Tensor Module::register_buffer(std::string name, Tensor value, bool persistent) {
  check_new_name(name, "buffer");
  LOCKSTEP_CHECK(value.defined(), "{}: buffer \"{}\" is an undefined tensor", type_name(), name);
  names_.insert(name);
  buffers_.push_back({std::move(name), value, persistent});
  buffer_stamp_ = next_stamp();  // a DataParallel's replicas made before lack it
  return value;
}

uint64_t Module::next_stamp() {
  static std::atomic<uint64_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed) + 1;
}

std::string Module::type_of(const std::type_info& type) {
  std::string name = type.name();
  int status = 0;
  char* demangled = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  if (status == 0 && demangled != nullptr) name = demangled;
  std::free(demangled);
  if (name.rfind("lockstep::", 0) == 0) name = name.substr(10);
  return name;
}

std::string Module::not_a(const std::string& user, const std::string& wants, const Module& m) {
  return fmt::format("{} calls this submodule as a {}, and the new module, a {}, is not one", user,
                     wants, m.type_name());
}

void Module::check_new_child(const std::string& name, const Module* module, const char* op) const {
  LOCKSTEP_CHECK(module != nullptr, "{}: {}(\"{}\"): the module is null", type_name(), op, name);
  // `module`'s subtree must not hold this module: the tree would contain itself.
  std::vector<const Module*> stack{module};
  std::unordered_set<const Module*> seen;
  while (!stack.empty()) {
    const Module* m = stack.back();
    stack.pop_back();
    if (!seen.insert(m).second) continue;
    LOCKSTEP_CHECK(m != this,
                   "{}: {}(\"{}\"): the module tree would contain itself ({}); a module cannot "
                   "be a submodule of itself or of one of its own submodules",
                   type_name(), op, name,
                   m == module ? "the new module is this module"
                               : "this module is inside the new " + module->type_name());
    for (const auto& [child_name, child] : m->children_) stack.push_back(child.get());
  }
}

void Module::add_child(std::string name, std::shared_ptr<Module> module) {
  check_new_name(name, "submodule");
  LOCKSTEP_CHECK(module != nullptr, "{}: submodule \"{}\" is null", type_name(), name);
  check_new_child(name, module.get(), "register_module");
  names_.insert(name);
  children_.emplace_back(std::move(name), std::move(module));
  stamp_ = next_stamp();
}

const std::shared_ptr<Module>& Module::find_child(const std::string& name, const char* op) const {
  for (const auto& [child_name, child] : children_)
    if (child_name == name) return child;
  throw Error(fmt::format("{}: {}(\"{}\"): there is no submodule of that name", type_name(), op,
                          name));
}

void Module::replace_child(const std::string& name, std::shared_ptr<Module> module) {
  LOCKSTEP_CHECK(module != nullptr, "{}: replace_child(\"{}\"): the new module is null",
                 type_name(), name);
  find_child(name, "replace_child");
  check_new_child(name, module.get(), "replace_child");
  // Every check before anything changes.
  for (const Binding& b : bindings_) {
    if (b.child != name) continue;
    const std::string why = b.refuse(*module);
    LOCKSTEP_CHECK(why.empty(), "{}: replace_child(\"{}\"): {}", type_name(), name, why);
  }
  for (auto& [child_name, child] : children_)
    if (child_name == name) child = module;
  for (const Binding& b : bindings_)
    if (b.child == name) b.set(module);
  stamp_ = next_stamp();
}

void Module::add_binding(Binding binding) {
  const std::shared_ptr<Module> current = find_child(binding.child, "bind_child");
  const std::string why = binding.refuse(*current);
  LOCKSTEP_CHECK(why.empty(), "{}: bind_child(\"{}\"): {}", type_name(), binding.child, why);
  binding.set(current);
  bindings_.push_back(std::move(binding));
}

void Module::freeze_child(const std::string& name, std::string reason) {
  Binding b{name, [reason = std::move(reason)](const Module&) { return reason; },
            [](const std::shared_ptr<Module>&) {}};
  find_child(name, "freeze_child");
  bindings_.push_back(std::move(b));
}

// ---- queries ----

NamedList<Module*> Module::named_modules() {
  NamedList<Module*> out;
  std::unordered_set<const Module*> seen;
  std::function<void(Module*, const std::string&)> walk = [&](Module* m, const std::string& prefix) {
    if (!seen.insert(m).second) return;
    out.emplace_back(prefix, m);
    for (auto& [name, child] : m->children_)
      walk(child.get(), prefix.empty() ? name : prefix + "." + name);
  };
  walk(this, "");
  return out;
}

NamedList<Tensor> Module::named_parameters(bool recurse) const {
  // named_modules() is non-const only because it hands out mutable pointers.
  auto modules = recurse ? const_cast<Module*>(this)->named_modules()
                         : NamedList<Module*>{{"", const_cast<Module*>(this)}};
  NamedList<Tensor> out;
  std::unordered_set<const TensorImpl*> seen;
  for (const auto& [prefix, m] : modules)
    for (const auto& s : m->params_)
      if (seen.insert(s.value.impl_ptr()).second)
        out.emplace_back(prefix.empty() ? s.name : prefix + "." + s.name, s.value);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

NamedList<Tensor> Module::named_buffers(bool recurse) const {
  auto modules = recurse ? const_cast<Module*>(this)->named_modules()
                         : NamedList<Module*>{{"", const_cast<Module*>(this)}};
  NamedList<Tensor> out;
  std::unordered_set<const TensorImpl*> seen;
  for (const auto& [prefix, m] : modules)
    for (const auto& s : m->buffers_)
      if (seen.insert(s.value.impl_ptr()).second)
        out.emplace_back(prefix.empty() ? s.name : prefix + "." + s.name, s.value);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_buffers(recurse)) out.push_back(t);
  return out;
}

NamedList<std::shared_ptr<Module>> Module::named_children() const {
  NamedList<std::shared_ptr<Module>> out;
  std::unordered_set<const Module*> seen;
  for (const auto& [name, m] : children_)
    if (seen.insert(m.get()).second) out.emplace_back(name, m);
  return out;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [name, m] : named_children()) out.push_back(m);
  return out;
}

void Module::apply(const std::function<void(Module&)>& fn) {
  std::unordered_set<const Module*> seen;
  std::function<void(Module&)> walk = [&](Module& m) {
    if (!seen.insert(&m).second) return;
    for (auto& [name, child] : m.children_) walk(*child);
    fn(m);
  };
  walk(*this);
}

std::vector<uint64_t> Module::structure_stamps() const {
  std::vector<uint64_t> out;
  for (const auto& [name, m] : const_cast<Module*>(this)->named_modules()) out.push_back(m->stamp_);
  return out;
}

std::vector<uint64_t> Module::buffer_stamps() const {
  std::vector<uint64_t> out;
  for (const auto& [name, m] : const_cast<Module*>(this)->named_modules())
    out.push_back(m->buffer_stamp_);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& t : parameters()) n += t.numel();
  return n;
}

// ---- state ----

void Module::collect_state(const std::string& prefix, StateDict& out) const {
  // PyTorch's order (Module._save_to_state_dict, then the children): own
  // parameters, own persistent buffers, then each submodule. Shared tensors
  // appear under every name, as in PyTorch.
  for (const auto& s : params_) out.insert(prefix + s.name, s.value.detach());
  for (const auto& s : buffers_)
    if (s.persistent) out.insert(prefix + s.name, s.value.detach());
  for (const auto& [name, child] : children_) child->collect_state(prefix + name + ".", out);
}

StateDict Module::state_dict() const {
  StateDict out;
  collect_state("", out);
  return out;
}

// ---- mode, device, gradients ----

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

template <class Fn>
void Module::for_each_tensor(Fn&& fn) {
  for (const auto& [prefix, m] : named_modules()) {
    for (auto& s : m->params_) fn(s.value);
    for (auto& s : m->buffers_) fn(s.value);
  }
}

Module& Module::to(Device device) {
  NoGradGuard no_grad;
  for_each_tensor([&](Tensor& t) {
    if (t.device() == device) return;  // also skips a tensor shared by two modules the 2nd time
    runtime::rebind(t, t.detach().to(device));
    if (t.grad().defined()) t.set_grad(t.grad().to(device));
  });
  return *this;
}

Module& Module::to(DType dtype) {
  LOCKSTEP_CHECK(runtime::is_floating(dtype),
                 "{}.to({}): modules convert to a floating-point dtype only", type_name(),
                 runtime::dtype_name(dtype));
  NoGradGuard no_grad;
  for_each_tensor([&](Tensor& t) {
    if (!runtime::is_floating(t.dtype()) || t.dtype() == dtype) return;
    runtime::rebind(t, t.detach().to(dtype));
    if (t.grad().defined()) t.set_grad(t.grad().to(dtype));
  });
  return *this;
}

void Module::zero_grad() {
  for (auto& t : parameters()) t.set_grad(Tensor{});
}

std::shared_ptr<Module> Module::replicate() const {
  throw Error(fmt::format(
      "{}: cannot be replicated for DataParallel; give the class a replicate() that builds a "
      "module of the same configuration with its submodules replicated (as the built-in layers "
      "do; see nn/module.h)",
      type_name()));
}

// ---- printing ----

std::string Module::str() const {
  // PyTorch's Module.__repr__: leaves print on one line, containers list
  // their children as "(name): child", indented.
  std::vector<std::string> lines;
  std::string extra = extra_repr();
  if (!extra.empty()) {
    std::istringstream in(extra);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
  }
  const size_t n_extra = lines.size();
  for (const auto& [name, child] : children_)
    lines.push_back("(" + name + "): " + add_indent(child->str(), 2));
  std::string out = type_name() + "(";
  if (n_extra == 1 && children_.empty()) {
    out += lines[0];
  } else if (!lines.empty()) {
    out += "\n";
    for (const auto& l : lines) out += "  " + l + "\n";
  }
  return out + ")";
}

std::ostream& operator<<(std::ostream& os, const Module& m) { return os << m.str(); }

}  // namespace lockstep::nn
