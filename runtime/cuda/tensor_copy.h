// Tensor copies that involve a CUDA device: the CUDA side of Tensor::copy_,
// fill_, zero_, add_ and mul_ (runtime/tensor_inplace.cpp calls these for
// CUDA tensors). All queue work on the current stream of the CUDA device
// involved; only a copy into host memory waits for it (the host reads next).
#pragma once

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::cuda {

// dst = src converted to dst's dtype and broadcast to dst's shape; either or
// both on a CUDA device (any two devices).
void copy_tensor(const Tensor& dst, const Tensor& src);
// Every element of the CUDA tensor `dst` = value.
void fill_tensor(const Tensor& dst, double value);
// In place on the CUDA tensor `dst`: dst += alpha * other, or dst *= other
// (`other` broadcast to dst, any device, converted to dst's dtype).
void add_tensor(const Tensor& dst, const Tensor& other, double alpha);
void mul_tensor(const Tensor& dst, const Tensor& other);
void mul_scalar(const Tensor& dst, double factor);
// dst = src * factor in one kernel (DDP's gradient into its bucket slot): both
// CUDA, same device, dtype and number of elements.
void scale_into(const Tensor& dst, const Tensor& src, double factor);

}  // namespace lockstep::runtime::cuda
