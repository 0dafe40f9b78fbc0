#include "lockstep/runtime/data/dataset.h"

#include <cstring>
#include <utility>

namespace lockstep::runtime {

namespace {

// Bytes of one sample of t: everything after dim 0.
size_t row_bytes(const Tensor& t) {
  Shape rest(t.shape().begin() + 1, t.shape().end());
  return static_cast<size_t>(shape_numel(rest)) * t.element_size();
}

// out[i] = src[indices[i]] along dim 0, one memcpy per sample.
Tensor gather_rows(const Tensor& src, std::span<const int64_t> indices) {
  Shape shape = src.shape();
  shape[0] = static_cast<int64_t>(indices.size());
  Tensor out = Tensor::empty(shape, src.dtype());
  const size_t row = row_bytes(src);
  if (row == 0 || indices.empty()) return out;
  const auto* from = static_cast<const uint8_t*>(src.raw_data());
  auto* to = static_cast<uint8_t*>(out.raw_data());
  for (size_t i = 0; i < indices.size(); ++i)
    std::memcpy(to + i * row, from + static_cast<size_t>(indices[i]) * row, row);
  return out;
}

}  // namespace

TensorDataset::TensorDataset(Tensor x, Tensor y) {
  LOCKSTEP_CHECK(x.defined() && y.defined(), "TensorDataset: x and y must be defined tensors");
  LOCKSTEP_CHECK(x.dim() >= 1 && y.dim() >= 1,
                 "TensorDataset: x and y need a sample dimension (dim 0); got shapes {} and {}",
                 shape_str(x.shape()), shape_str(y.shape()));
  LOCKSTEP_CHECK(x.size(0) == y.size(0),
                 "TensorDataset: x has {} samples but y has {} (shapes {} and {})", x.size(0),
                 y.size(0), shape_str(x.shape()), shape_str(y.shape()));
  LOCKSTEP_CHECK(x.device().is_cpu() && y.device().is_cpu(),
                 "TensorDataset: x and y must be CPU tensors; batches are moved to the device "
                 "after gathering");
  // Contiguous once here, so every gather is a plain memcpy per sample.
  x_ = x.detach().contiguous();
  y_ = y.detach().contiguous();
}

Batch TensorDataset::get_batch(std::span<const int64_t> indices) const {
  const int64_t n = size();
  for (int64_t i : indices)
    LOCKSTEP_CHECK(i >= 0 && i < n, "TensorDataset: index {} is out of range for {} samples", i,
                   n);
  return {gather_rows(x_, indices), gather_rows(y_, indices)};
}

}  // namespace lockstep::runtime
