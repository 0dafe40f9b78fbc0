// From Tensors to the plain kernel arguments of cuda/kernels/ (see
// kernel_types.h for why kernels do not see Tensors), and the checks every
// CUDA op makes first.
#pragma once

#include <array>
#include <string_view>

#include <cuda_runtime_api.h>

#include "lockstep/runtime/cuda/kernels/kernel_types.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::cuda {

kernels::ScalarType scalar_type(DType dtype);

// The iteration space of `shape` over the operands (operand 0 usually the
// output, already of that shape; the others broadcast to it), with the
// dimensions merged that are contiguous in all of them. Throws if more than
// kernels::kMaxDims dimensions remain.
template <int N>
kernels::ElementwiseArgs<N> elementwise_args(const Shape& shape,
                                             const std::array<const Tensor*, N>& operands);

// The current stream of the tensor's device, where ops queue their kernels.
cudaStream_t stream_of(const Tensor& t);

// Throws naming `op` unless every defined tensor is on `device`.
void check_device(std::string_view op, Device device, std::initializer_list<const Tensor*> tensors);

}  // namespace lockstep::runtime::cuda
