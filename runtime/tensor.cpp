// Tensor basics: factories, metadata, element access, autograd accessors,
// printing. Views live in tensor_views.cpp, in-place writes in tensor_inplace.cpp.
#include "lockstep/runtime/tensor.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <ostream>

#include "lockstep/runtime/autograd/detail/accumulate_grad.h"
#include "lockstep/runtime/autograd/detail/engine.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/autograd/detail/meta.h"
#include "lockstep/runtime/ops/detail/convert.h"

namespace lockstep::runtime {

TensorImpl::TensorImpl(std::shared_ptr<Storage> storage_, Shape shape_, Shape strides_,
                       int64_t offset_, DType dtype_)
    : storage(std::move(storage_)),
      shape(std::move(shape_)),
      strides(std::move(strides_)),
      offset(offset_),
      dtype(dtype_) {
  shape_numel(shape);  // views too (expand): refuses a count that overflows
}

TensorImpl::~TensorImpl() = default;

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    strides[d] = s;
    // Past 64 bits only in an empty tensor (shape_numel refuses the rest),
    // where no stride is ever used: saturate rather than overflow.
    if (__builtin_mul_overflow(s, std::max<int64_t>(shape[d], 1), &s))
      s = std::numeric_limits<int64_t>::max();
  }
  return strides;
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  bool overflow = false;
  for (int64_t v : shape) {
    if (v == 0) return 0;  // empty, however large the other sizes
    overflow = __builtin_mul_overflow(n, v, &n) || overflow;
  }
  // Wrapped, the count would describe a small tensor and index far outside it.
  LOCKSTEP_CHECK(!overflow, "shape {} has more elements than a 64-bit count can hold",
                 shape_str(shape));
  return n;
}

int64_t wrap_dim(int64_t dim, int64_t ndim) {
  int64_t lo = ndim == 0 ? -1 : -ndim, hi = ndim == 0 ? 0 : ndim - 1;
  LOCKSTEP_CHECK(dim >= lo && dim <= hi,
                 "dimension {} is out of range for a tensor with {} dims (expected {}..{})", dim,
                 ndim, lo, hi);
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

TensorImpl& Tensor::impl() const {
  LOCKSTEP_CHECK(impl_ != nullptr, "operation on an undefined tensor");
  return *impl_;
}

// ---- factories ----

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t v : shape)
    LOCKSTEP_CHECK(v >= 0, "cannot create a tensor with negative size: shape {}", shape_str(shape));
  int64_t nbytes = 0;
  LOCKSTEP_CHECK(!__builtin_mul_overflow(shape_numel(shape), dtype_size(dtype), &nbytes),
                 "cannot create a tensor of shape {} and dtype {}: its size in bytes does not "
                 "fit in 64 bits",
                 shape_str(shape), dtype_name(dtype));
  auto storage = std::make_shared<Storage>(static_cast<size_t>(nbytes), device);
  return Tensor(std::make_shared<TensorImpl>(std::move(storage), shape, contiguous_strides(shape), 0, dtype));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (t.numel() == 0) return t;
  if (device.is_cuda()) {
    NoGradGuard no_grad;
    t.fill_(0.0);
  } else {
    std::memset(t.raw_data(), 0, t.numel() * t.element_size());
  }
  return t;
}

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  NoGradGuard no_grad;
  t.fill_(value);
  return t;
}

Tensor Tensor::scalar(double value, DType dtype) { return full({}, value, dtype); }

Tensor Tensor::arange(int64_t n, DType dtype) {
  Tensor t = empty({n}, dtype);
  dispatch_all(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = t.data_ptr<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = detail::convert<T>(i);
  });
  return t;
}

// ---- metadata ----

namespace {
// A dim of a tensor that has one: a 0-d tensor has no size or stride to read
// (wrap_dim accepts 0 and -1 for it, as dims of reductions).
int64_t existing_dim(const Tensor& t, int64_t d, const char* what) {
  LOCKSTEP_CHECK(t.dim() > 0, "{}: dimension {} of a 0-d tensor; it has no dimensions", what, d);
  return wrap_dim(d, t.dim());
}
}  // namespace

int64_t Tensor::size(int64_t d) const { return shape()[existing_dim(*this, d, "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[existing_dim(*this, d, "stride")]; }
int64_t Tensor::numel() const { return shape_numel(shape()); }

// As PyTorch's: a tensor of no elements is contiguous whatever its strides
// (there is no element whose place they could get wrong).
bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (shape()[d] == 1) continue;
    if (strides()[d] != expected) return false;
    expected *= shape()[d];
  }
  return true;
}

void* Tensor::raw_data() const {
  return static_cast<char*>(storage()->data()) + storage_offset() * element_size();
}

double Tensor::item() const {
  LOCKSTEP_CHECK(numel() == 1, "item(): the tensor has {} elements (shape {}), expected exactly 1",
                 numel(), shape_str(shape()));
  if (!device().is_cpu()) return to(Device::cpu()).item();  // waits for the device
  return dispatch_all(dtype(), [&](auto tag) {
    using T = decltype(tag);
    return detail::convert<double>(*static_cast<const T*>(raw_data()));
  });
}

// ---- autograd ----

bool Tensor::requires_grad() const {
  const auto& meta = impl().autograd;
  return meta && (meta->requires_grad || meta->grad_fn);
}

Tensor& Tensor::requires_grad_(bool on) {
  // A computed tensor already requires grad: asking for it again changes
  // nothing (as in PyTorch, where ported code often does), turning it off
  // cannot be done.
  if (on && !is_leaf()) return *this;
  LOCKSTEP_CHECK(is_leaf(),
                 "requires_grad_(false) can only be set on leaf tensors; this one is the result "
                 "of {} (use detach() to get a leaf that does not require grad)",
                 grad_fn()->name());
  LOCKSTEP_CHECK(!on || is_floating(dtype()),
                 "only floating-point tensors can require grad; this one is {}", dtype_name(dtype()));
  autograd_meta(impl()).requires_grad = on;
  return *this;
}

bool Tensor::is_leaf() const { return !impl().autograd || !impl().autograd->grad_fn; }

const Tensor& Tensor::grad() const {
  static const Tensor kUndefined;
  const auto& meta = impl().autograd;
  return meta ? meta->grad : kUndefined;
}

void Tensor::set_grad(const Tensor& g) {
  // As PyTorch's .grad setter: the gradient is accumulated into in place, so
  // it must be of the tensor's shape, dtype and device.
  LOCKSTEP_CHECK(!g.defined() || g.shape() == shape(),
                 "set_grad: gradient of shape {} for a tensor of shape {}", shape_str(g.shape()),
                 shape_str(shape()));
  LOCKSTEP_CHECK(!g.defined() || (g.dtype() == dtype() && g.device() == device()),
                 "set_grad: gradient of dtype {} on {} for a tensor of dtype {} on {}; convert "
                 "it with .to()",
                 g.defined() ? dtype_name(g.dtype()) : "", g.defined() ? g.device().str() : "",
                 dtype_name(dtype()), device().str());
  autograd_meta(impl()).grad = g;
}

std::shared_ptr<Node> Tensor::grad_fn() const {
  return impl().autograd ? impl().autograd->grad_fn : nullptr;
}

Tensor Tensor::detach() const {
  return Tensor(std::make_shared<TensorImpl>(storage(), shape(), strides(), storage_offset(), dtype()));
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  LOCKSTEP_CHECK(requires_grad(),
                 "backward(): this tensor does not require grad and has no grad_fn, so there is "
                 "nothing to differentiate. Set requires_grad_() on the leaves (parameters) "
                 "before computing it, and do not compute it under NoGradGuard.");
  Tensor seed = gradient;
  if (!seed.defined()) {
    LOCKSTEP_CHECK(numel() == 1,
                   "backward(): a gradient can be created implicitly only for a one-element "
                   "output; this output has shape {}, so pass a gradient of that shape",
                   shape_str(shape()));
    seed = Tensor::ones(shape(), dtype(), device());
  }
  LOCKSTEP_CHECK(seed.shape() == shape(),
                 "backward(): gradient has shape {} but the output has shape {}",
                 shape_str(seed.shape()), shape_str(shape()));
  LOCKSTEP_CHECK(seed.device() == device(),
                 "backward(): the gradient is on {} but the output on {}; move it there with "
                 ".to({})",
                 seed.device().str(), device().str(), device().str());
  // As PyTorch: the gradient takes the output's dtype. Backward kernels read
  // the incoming gradient at the dtype of the op's output.
  if (seed.dtype() != dtype()) seed = seed.detach().to(dtype());
  run_backward(*this, seed, retain_graph);
}

int64_t Tensor::register_post_accumulate_grad_hook(PostAccumulateGradHook fn) {
  LOCKSTEP_CHECK(is_leaf() && requires_grad(),
                 "register_post_accumulate_grad_hook: only leaf tensors that require grad "
                 "accumulate gradients");
  AutogradMeta& meta = autograd_meta(impl());
  // Under the lock AccumulateGrad copies the list under: a backward on
  // another thread may be reading it.
  std::lock_guard<std::mutex> lock(meta.grad_mutex);
  int64_t id = meta.next_hook_id++;
  meta.post_accumulate_hooks.emplace_back(id, std::move(fn));
  return id;
}

int64_t Tensor::register_hook(GradHook fn) {
  LOCKSTEP_CHECK(requires_grad(),
                 "register_hook: cannot register a hook on a tensor that doesn't require "
                 "gradient; call requires_grad_() on the leaf first, or register the hook on a "
                 "tensor computed from one that requires grad (outside NoGradGuard)");
  LOCKSTEP_CHECK(fn != nullptr, "register_hook: the hook is empty");
  AutogradMeta& meta = autograd_meta(impl());
  std::lock_guard<std::mutex> lock(meta.grad_mutex);
  int64_t id = meta.next_hook_id++;
  if (meta.grad_fn)
    meta.grad_fn->add_tensor_hook(id, std::move(fn));
  else
    meta.grad_hooks.emplace_back(id, std::move(fn));
  return id;
}

void Tensor::remove_hook(int64_t id) {
  if (!impl().autograd) return;
  AutogradMeta& meta = *impl().autograd;
  std::lock_guard<std::mutex> lock(meta.grad_mutex);
  std::erase_if(meta.post_accumulate_hooks, [id](const auto& h) { return h.first == id; });
  std::erase_if(meta.grad_hooks, [id](const auto& h) { return h.first == id; });
  if (meta.grad_fn) meta.grad_fn->remove_tensor_hook(id);
}

// ---- printing ----

namespace {

void print_values(std::string& out, const Tensor& t, int64_t d, int64_t offset, bool summarize) {
  constexpr int64_t kEdge = 3;
  const int64_t n = t.shape()[d];
  out += '[';
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && n > 2 * kEdge && i == kEdge) {
      out += "..., ";
      i = n - kEdge;
    }
    int64_t off = offset + i * t.strides()[d];
    if (d + 1 == t.dim()) {
      dispatch_all(t.dtype(), [&](auto tag) {
        using T = decltype(tag);
        T v = static_cast<const T*>(t.storage()->data())[off];
        if constexpr (std::is_same_v<T, bool>) out += v ? "true" : "false";
        else if constexpr (std::is_integral_v<T>) out += fmt::format("{}", static_cast<int64_t>(v));
        else out += fmt::format("{:.4g}", detail::convert<double>(v));  // f64 beyond float range too
      });
    } else {
      print_values(out, t, d + 1, off, summarize);
    }
    if (i + 1 < n) out += d + 1 == t.dim() ? ", " : ",\n ";
  }
  out += ']';
}

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  std::string out = "tensor(";
  if (dim() == 0) {
    out += fmt::format("{:.6g}", item());
  } else if (numel() == 0) {
    out += "[]";
  } else if (device().is_cpu()) {
    print_values(out, *this, 0, storage_offset(), numel() > 1000);
  } else {
    const Tensor host = detach().to(Device::cpu());
    print_values(out, host, 0, host.storage_offset(), numel() > 1000);
  }
  out += fmt::format(", shape={}, dtype={}", shape_str(shape()), dtype_name(dtype()));
  if (!device().is_cpu()) out += ", device=" + device().str();
  if (requires_grad()) out += grad_fn() ? ", grad_fn=" + grad_fn()->name() : ", requires_grad";
  return out + ")";
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace lockstep::runtime
