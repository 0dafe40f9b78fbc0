// Datasets: a size and a way to gather a batch of samples by index.
#pragma once

#include <cstdint>
#include <span>

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

// Inputs and targets of one batch; dim 0 of both is the batch.
struct Batch {
  Tensor x;
  Tensor y;
  int64_t size() const { return x.size(0); }
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // The samples at `indices`, in that order. Each index must be in [0, size()).
  // No indices: the empty batch, [0, ...one sample's shape...] with the
  // dataset's dtypes (what nn::Join gives a rank whose data has run out).
  virtual Batch get_batch(std::span<const int64_t> indices) const = 0;
};

// A dataset held in memory as two tensors whose dim 0 is the sample: x [N, ...]
// and y [N, ...]. Gathering a batch allocates the two batch tensors once and
// copies each sample with one memcpy, so the tensors are made contiguous (on
// the CPU) here, once.
class TensorDataset : public Dataset {
 public:
  TensorDataset(Tensor x, Tensor y);

  int64_t size() const override { return x_.size(0); }
  Batch get_batch(std::span<const int64_t> indices) const override;

  const Tensor& x() const { return x_; }
  const Tensor& y() const { return y_; }

 private:
  Tensor x_;
  Tensor y_;
};

}  // namespace lockstep::runtime
