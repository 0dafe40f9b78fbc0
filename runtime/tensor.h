// Tensor: a cheap shared handle to a strided view of a storage, with autograd.
//
// Copies of a Tensor share the same TensorImpl (like torch.Tensor in Python):
// `Tensor b = a;` aliases, `a.clone()` copies. Views (reshape of a contiguous
// tensor, permute, transpose, slice, expand, select, ...) share storage.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/runtime/dtype.h"
#include "lockstep/runtime/storage.h"

namespace lockstep::runtime {

using Shape = std::vector<int64_t>;

class Node;
struct AutogradMeta;
class Tensor;

using PostAccumulateGradHook = std::function<void(Tensor&)>;
// Sees the gradient flowing into a tensor; returns a replacement, or an
// undefined tensor to keep it.
using GradHook = std::function<Tensor(const Tensor&)>;

struct TensorImpl {
  TensorImpl(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset,
             DType dtype);
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;       // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  std::unique_ptr<AutogradMeta> autograd;  // created when first needed
  ~TensorImpl();
};

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- factories (CPU unless a device is given) ----
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
                     Device device = Device::cpu());
  static Tensor scalar(double value, DType dtype = DType::f32);
  static Tensor arange(int64_t n, DType dtype = DType::i64);
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape);

  // ---- metadata ----
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t size(int64_t d) const;    // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const;
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  int64_t storage_offset() const { return impl().offset; }
  bool is_contiguous() const;
  size_t element_size() const { return dtype_size(dtype()); }
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }
  TensorImpl* impl_ptr() const { return impl_.get(); }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }
  long use_count() const { return impl_.use_count(); }  // handles sharing this tensor

  // ---- element access (pointers are device pointers for CUDA tensors) ----
  template <class T> T* data_ptr() const;  // checks dtype; points at element 0 of the view
  void* raw_data() const;
  double item() const;  // one-element tensor -> double (waits for a CUDA device)
  template <class T> std::vector<T> to_vector() const;  // logical (row-major) order, on the host

  // ---- views and copies ----
  Tensor view(const Shape& shape) const;     // needs compatible strides; one dim may be -1
  Tensor reshape(const Shape& shape) const;  // a view when possible, else a copy
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;  // transpose(0, 1); of a 0-D or 1-D tensor, a view of the same shape
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;  // drops `dim`
  Tensor expand(const Shape& shape) const;          // -1 keeps a size
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;  // a view of the same shape where dim is not of size 1
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor contiguous() const;  // self if already contiguous
  Tensor clone() const;
  Tensor to(DType dtype) const;  // self if already that dtype
  Tensor to(Device device) const;  // differentiable; waits only when copying to the host

  // ---- in place (bump the version counter; refuse on leaves that require grad
  //      while grad mode is on) ----
  Tensor& zero_();
  Tensor& fill_(double value);  // an integer dtype refuses a value outside its range
  Tensor& copy_(const Tensor& src);  // broadcasts src, converts dtype
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& mul_(double factor);
  Tensor& mul_(const Tensor& other);

  // ---- autograd ----
  bool requires_grad() const;
  Tensor& requires_grad_(bool on = true);  // off: leaves only; on: a no-op on a computed one
  bool is_leaf() const;                     // no grad_fn
  const Tensor& grad() const;               // undefined until a backward wrote it
  void set_grad(const Tensor& g);
  std::shared_ptr<Node> grad_fn() const;
  Tensor detach() const;  // shares storage, no history
  // Seeds with ones for a one-element tensor; otherwise `gradient` is required.
  void backward(const Tensor& gradient = {}, bool retain_graph = false) const;
  // Fires right after this leaf's .grad has been accumulated during backward.
  // Returns an id for remove_hook.
  int64_t register_post_accumulate_grad_hook(PostAccumulateGradHook fn);
  // As torch.Tensor.register_hook: fn sees this tensor's gradient each time
  // backward computes it (summed over its uses), and what it returns (same
  // shape) replaces it: on a leaf, before it is added into .grad; on a
  // computed tensor, before it flows further back. Hooks chain in the order
  // they were registered. Returns an id for remove_hook.
  int64_t register_hook(GradHook fn);
  void remove_hook(int64_t id);  // either kind of hook
  uint64_t version() const { return impl().storage->version(); }

  std::string str() const;  // shape, dtype, device and (abbreviated) values

 private:
  TensorImpl& impl() const;
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);
std::string shape_str(const Shape& s);  // "[2, 3]"

// Row-major strides for a shape.
Shape contiguous_strides(const Shape& shape);
int64_t shape_numel(const Shape& shape);
// Normalises a possibly-negative dim against `ndim`, with a clear error.
int64_t wrap_dim(int64_t dim, int64_t ndim);

template <class T>
T* Tensor::data_ptr() const {
  LOCKSTEP_CHECK(dtype_v<T> == dtype(), "data_ptr: tensor has dtype {}, asked for {}",
                 dtype_name(dtype()), dtype_name(dtype_v<T>));
  return static_cast<T*>(raw_data());
}

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape) {
  LOCKSTEP_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
                 "from_vector: {} values for shape {}", values.size(), shape_str(shape));
  Tensor t = empty(shape, dtype_v<T>);
  T* p = t.data_ptr<T>();
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = to(Device::cpu()).to(dtype_v<T>).contiguous();
  const T* p = c.data_ptr<T>();
  return std::vector<T>(p, p + c.numel());
}

}  // namespace lockstep::runtime
