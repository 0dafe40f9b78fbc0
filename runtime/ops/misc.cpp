// dropout, embedding and cat: small ops whose CPU loops fit next to their
// wiring. Autograd is recorded here for every device; tensors off the CPU run
// their device backend's kernels, and cat's copies run on Tensor::copy_.
#include "lockstep/runtime/ops/misc.h"

#include <algorithm>
#include <cstring>

#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/device_backend.h"

namespace lockstep::runtime {
namespace {

void check_defined(const char* op, const Tensor& t, const char* what) {
  LOCKSTEP_CHECK(t.defined(), "{}: {} is undefined", op, what);
}

bool on_device(const Tensor& t) { return !t.device().is_cpu(); }

// Draws per chunk: the mask is built from the generator's stream in order, so
// chunking does not change it.
constexpr int64_t kDrawChunk = 4096;

// The CPU mask and output: draw i decides element i.
void dropout_cpu(const Tensor& xc, const Tensor& out, const Tensor& mask, uint64_t threshold,
                 double scale, Generator& g) {
  const int64_t n = xc.numel();
  dispatch_floating(xc.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* xp = xc.data_ptr<T>();
    T* yp = out.data_ptr<T>();
    uint8_t* mp = mask.data_ptr<uint8_t>();
    const C s = static_cast<C>(scale);
    uint32_t draws[kDrawChunk];
    for (int64_t i0 = 0; i0 < n; i0 += kDrawChunk) {
      const int64_t m = std::min(kDrawChunk, n - i0);
      g.fill_u32(draws, static_cast<size_t>(m));
      for (int64_t i = 0; i < m; ++i) {
        const bool keep = draws[i] < threshold;
        mp[i0 + i] = keep;
        yp[i0 + i] = static_cast<T>(static_cast<C>(xp[i0 + i]) * (keep ? s : C(0)));
      }
    }
  });
}

void dropout_backward_cpu(const Tensor& gy, const Tensor& mask, double scale, const Tensor& gx) {
  dispatch_floating(gy.dtype(), "dropout backward", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* gp = gy.data_ptr<T>();
    const uint8_t* mp = mask.data_ptr<uint8_t>();
    T* out = gx.data_ptr<T>();
    const C s = static_cast<C>(scale);
    for (int64_t i = 0, n = gy.numel(); i < n; ++i)
      out[i] = static_cast<T>(static_cast<C>(gp[i]) * (mp[i] ? s : C(0)));
  });
}

}  // namespace

// Element i is kept when the i-th 32-bit draw u satisfies u < (1 - p) * 2^32,
// then scaled by 1 / (1 - p) so the expectation is unchanged. The mask is kept
// as bytes for backward: grad_x = grad_y * mask / (1 - p). CUDA draws the same
// stream (cuda/ops/misc.h), so both devices make the same mask.
Tensor dropout(const Tensor& x, double p, bool training, Generator& g) {
  LOCKSTEP_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability p = {} must be in [0, 1]", p);
  if (!training || p == 0.0) return x;
  check_defined("dropout", x, "input");
  const Tensor xc = x.contiguous();
  Tensor out = Tensor::empty(xc.shape(), xc.dtype(), xc.device());
  if (p == 1.0) {
    // Everything dropped: no draws needed, and no 1 / (1 - p).
    LOCKSTEP_CHECK(is_floating(xc.dtype()), "dropout: needs a floating tensor, got {}",
                   dtype_name(xc.dtype()));
    out.zero_();
    return record(std::move(out), "DropoutBackward", {x}, {}, [](const BackwardArgs& a) {
      return std::vector<Tensor>{Tensor::zeros(a.grad.shape(), a.grad.dtype(), a.grad.device())};
    });
  }
  const double scale = 1.0 / (1.0 - p);
  const uint64_t threshold = static_cast<uint64_t>((1.0 - p) * 4294967296.0);
  Tensor mask = Tensor::empty(xc.shape(), DType::u8, xc.device());
  if (on_device(xc)) {
    device_backend(xc.device()).dropout_forward(xc, out, mask, threshold, scale, g);
  } else {
    dropout_cpu(xc, out, mask, threshold, scale, g);
  }
  // The mask is a saved tensor, not a capture: activation checkpointing can
  // then drop it with the rest of a region's activations.
  return record(std::move(out), "DropoutBackward", {x}, {mask},
                [scale](const BackwardArgs& a) {
                  const Tensor& mask = a.saved[0];
                  const Tensor gy = a.grad.contiguous();
                  Tensor gx = Tensor::empty(gy.shape(), gy.dtype(), gy.device());
                  if (on_device(gy)) {
                    device_backend(gy.device()).dropout_backward(gy, mask, scale, gx);
                  } else {
                    dropout_backward_cpu(gy, mask, scale, gx);
                  }
                  return std::vector<Tensor>{gx};
                });
}

namespace {

template <class I>
void check_indices(const I* idx, int64_t n, int64_t rows) {
  for (int64_t i = 0; i < n; ++i) {
    LOCKSTEP_CHECK(idx[i] >= 0 && idx[i] < rows,
                   "embedding: index {} (at flat position {}) is out of range for a table of {} "
                   "rows; valid indices are 0..{}",
                   static_cast<int64_t>(idx[i]), i, rows, rows - 1);
  }
}

template <class Fn>
void for_each_index(const Tensor& indices, Fn&& fn) {
  const int64_t n = indices.numel();
  if (indices.dtype() == DType::i64) {
    const int64_t* p = indices.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) fn(i, p[i]);
  } else {
    const int32_t* p = indices.data_ptr<int32_t>();
    for (int64_t i = 0; i < n; ++i) fn(i, static_cast<int64_t>(p[i]));
  }
}

}  // namespace

// PyTorch's rule for padding_idx: within [-rows, rows), negative from the end.
// Returns the row in [0, rows), or -1 for none.
int64_t resolve_padding_idx(std::optional<int64_t> padding_idx, int64_t rows) {
  if (!padding_idx) return -1;
  const int64_t p = *padding_idx;
  LOCKSTEP_CHECK(p >= -rows && p < rows,
                 "embedding: padding_idx {} is out of range for a table of {} rows; give one in "
                 "[{}, {}) (negative counts from the end) or none",
                 p, rows, -rows, rows);
  return p < 0 ? p + rows : p;
}

Tensor embedding(const Tensor& indices_in, const Tensor& weight_in,
                 std::optional<int64_t> padding_idx) {
  check_defined("embedding", indices_in, "indices");
  check_defined("embedding", weight_in, "weight");
  LOCKSTEP_CHECK(indices_in.device() == weight_in.device(),
                 "embedding: indices are on {} but weight is on {}; move them to one device",
                 indices_in.device().str(), weight_in.device().str());
  LOCKSTEP_CHECK(weight_in.dim() == 2, "embedding: expected weight [num_embeddings, dim], got {}",
                 shape_str(weight_in.shape()));
  LOCKSTEP_CHECK(indices_in.dtype() == DType::i64 || indices_in.dtype() == DType::i32,
                 "embedding: indices must be i64 or i32, got {}",
                 dtype_name(indices_in.dtype()));
  const Tensor indices = indices_in.contiguous();
  const Tensor weight = weight_in.contiguous();
  const int64_t rows = weight.size(0), dim = weight.size(1), n = indices.numel();
  const int64_t pad = resolve_padding_idx(padding_idx, rows);
  Shape shape = indices.shape();
  shape.push_back(dim);
  Tensor out = Tensor::empty(shape, weight.dtype(), weight.device());
  if (on_device(weight)) {
    // Indices are not checked here: that would wait for the device.
    device_backend(weight.device()).embedding_forward(indices, weight, out);
  } else {
    if (indices.dtype() == DType::i64)
      check_indices(indices.data_ptr<int64_t>(), n, rows);
    else
      check_indices(indices.data_ptr<int32_t>(), n, rows);
    // Rows are copied as bytes, so the lookup works for every dtype.
    const size_t row_bytes = static_cast<size_t>(dim) * weight.element_size();
    const auto* src = static_cast<const char*>(weight.raw_data());
    auto* dst = static_cast<char*>(out.raw_data());
    for_each_index(indices, [&](int64_t i, int64_t r) {
      std::memcpy(dst + i * row_bytes, src + r * row_bytes, row_bytes);
    });
  }

  return record(std::move(out), "EmbeddingBackward", {weight_in}, {indices},
                [rows, dim, pad](const BackwardArgs& a) {
                  const Tensor& idx = a.saved[0];
                  const Tensor gy = a.grad.contiguous();
                  if (on_device(gy))
                    return std::vector<Tensor>{
                        device_backend(gy.device()).embedding_backward(gy, idx, rows, dim, pad)};
                  // bf16/f16 rows add up in f32 and round once at the end.
                  const DType acc = is_reduced_float(gy.dtype()) ? DType::f32 : gy.dtype();
                  const Tensor ga = gy.to(acc);
                  Tensor gw = Tensor::zeros({rows, dim}, acc);
                  dispatch_float(acc, "embedding backward", [&](auto tag) {
                    using T = decltype(tag);
                    const T* g = ga.data_ptr<T>();
                    T* w = gw.data_ptr<T>();
                    for_each_index(idx, [&](int64_t i, int64_t r) {
                      if (r == pad) return;
                      const T* gi = g + i * dim;
                      T* wr = w + r * dim;
                      for (int64_t j = 0; j < dim; ++j) wr[j] += gi[j];
                    });
                  });
                  return std::vector<Tensor>{gw.to(gy.dtype())};
                });
}

namespace {

// As PyTorch (its legacy rule): a 1-D tensor of no elements, such as the
// empty start of a loop that appends with cat, takes no part in the shape.
bool cat_skips(const Tensor& t) { return t.dim() == 1 && t.numel() == 0; }

}  // namespace

// The output is [outer, total, inner] with outer = prod(shape[:dim]) and
// inner = prod(shape[dim+1:]); tensor i fills columns [offset_i, offset_i +
// size_i) of the middle axis. Copies are done as bytes (any dtype); backward
// slices the gradient the same way.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  LOCKSTEP_CHECK(!tensors.empty(), "cat: expected at least one tensor, got an empty list");
  if (auto c = detail::autocast_inputs(detail::CastPolicy::promote, tensors)) return cat(*c, dim);
  for (size_t i = 0; i < tensors.size(); ++i) {
    LOCKSTEP_CHECK(tensors[i].defined(), "cat: tensor {} is undefined", i);
    LOCKSTEP_CHECK(tensors[i].device() == tensors[0].device(),
                   "cat: tensor {} is on {} but tensor 0 is on {}; move them to one device", i,
                   tensors[i].device().str(), tensors[0].device().str());
  }
  // The shapes are checked against the first tensor that is not skipped.
  size_t r = 0;
  while (r + 1 < tensors.size() && cat_skips(tensors[r])) ++r;
  const Tensor& ref = tensors[r];
  LOCKSTEP_CHECK(ref.dim() > 0, "cat: tensor {} is zero-dimensional; cat needs tensors with at "
                 "least one dim", r);
  const int64_t d = wrap_dim(dim, ref.dim());
  Shape shape = ref.shape();
  shape[d] = 0;
  std::vector<int64_t> sizes;
  std::vector<bool> skipped;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    LOCKSTEP_CHECK(t.dtype() == ref.dtype(), "cat: tensor {} is {} but tensor {} is {}; convert "
                   "with .to()", i, dtype_name(t.dtype()), r, dtype_name(ref.dtype()));
    skipped.push_back(i != r && cat_skips(t));
    bool same = t.dim() == ref.dim() || skipped.back();
    for (int64_t k = 0; same && !skipped.back() && k < ref.dim(); ++k)
      same = k == d || t.size(k) == ref.size(k);
    LOCKSTEP_CHECK(same, "cat: tensor {} has shape {} but tensor {} has shape {}; all sizes must "
                   "match except in dim {}", i, shape_str(t.shape()), r, shape_str(ref.shape()),
                   d);
    sizes.push_back(skipped.back() ? 0 : t.size(d));
    shape[d] += sizes.back();
  }
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < d; ++k) outer *= shape[k];
  for (int64_t k = d + 1; k < ref.dim(); ++k) inner *= shape[k];
  const size_t esize = ref.element_size();
  const int64_t total = shape[d];

  Tensor out = Tensor::empty(shape, ref.dtype(), ref.device());
  if (on_device(out)) {
    // One strided copy kernel per input into its slice of the output.
    int64_t offset = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (sizes[i] > 0) out.slice(d, offset, offset + sizes[i]).copy_(tensors[i]);
      offset += sizes[i];
    }
  } else {
    auto* dst = static_cast<char*>(out.raw_data());
    int64_t offset = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Tensor src_t = tensors[i].contiguous();
      const auto* src = static_cast<const char*>(src_t.raw_data());
      const size_t block = static_cast<size_t>(sizes[i] * inner) * esize;
      for (int64_t o = 0; o < outer && block > 0; ++o)
        std::memcpy(dst + ((o * total + offset) * inner) * esize, src + o * block, block);
      offset += sizes[i];
    }
  }

  return record(std::move(out), "CatBackward", tensors, {},
                [sizes, skipped, d, outer, inner, total](const BackwardArgs& a) {
                  if (on_device(a.grad)) {
                    // Fresh tensors, as on the CPU: gradients never alias each other.
                    std::vector<Tensor> grads(sizes.size());
                    int64_t offset = 0;
                    for (size_t i = 0; i < sizes.size(); ++i) {
                      if (a.needs[i]) {
                        const Tensor part = a.grad.slice(d, offset, offset + sizes[i]);
                        grads[i] = Tensor::empty(skipped[i] ? Shape{0} : part.shape(),
                                                 part.dtype(), part.device());
                        if (sizes[i] > 0) grads[i].copy_(part);
                      }
                      offset += sizes[i];
                    }
                    return grads;
                  }
                  const Tensor gy = a.grad.contiguous();
                  const size_t esize = gy.element_size();
                  const auto* src = static_cast<const char*>(gy.raw_data());
                  std::vector<Tensor> grads(sizes.size());
                  int64_t offset = 0;
                  for (size_t i = 0; i < sizes.size(); ++i) {
                    if (a.needs[i]) {
                      Shape s = gy.shape();
                      s[d] = sizes[i];
                      grads[i] = Tensor::empty(skipped[i] ? Shape{0} : s, gy.dtype());
                      auto* dst = static_cast<char*>(grads[i].raw_data());
                      const size_t block = static_cast<size_t>(sizes[i] * inner) * esize;
                      for (int64_t o = 0; o < outer && block > 0; ++o)
                        std::memcpy(dst + o * block, src + ((o * total + offset) * inner) * esize,
                                    block);
                    }
                    offset += sizes[i];
                  }
                  return grads;
                });
}

}  // namespace lockstep::runtime
