// Plain descriptions of tensors for CUDA kernels.
//
// .cu files cannot include lockstep's tensor headers (nvcc does not compile
// the fmt library they use), so host code (cuda/tensor_args.h) flattens each
// Tensor into these structs and the kernels see only pointers, sizes and
// strides. Headers in cuda/kernels/ include nothing but the C++ and CUDA
// runtime headers.
#pragma once

#include <cstdint>

namespace lockstep::runtime::cuda::kernels {

inline constexpr int kMaxDims = 8;

// Mirrors runtime::DType value for value (checked in cuda/tensor_args.cpp).
enum class ScalarType : uint8_t { f32, f64, bf16, f16, i32, i64, u8, boolean };

// One iteration space shared by N operands (operand 0 is the output by
// convention), after dimensions contiguous in every operand were merged
// (cuda/core/coalesce_dims.h). Strides are in elements; 0 broadcasts.
template <int N>
struct ElementwiseArgs {
  int ndim = 0;
  int64_t numel = 0;
  int64_t sizes[kMaxDims] = {};
  void* data[N] = {};  // element 0 of each operand's view
  int64_t strides[N][kMaxDims] = {};
  ScalarType dtype[N] = {};
  // Every operand is dense with stride 1 over one dimension (or is a scalar
  // for ndim 0): kernels take their vectorised path.
  bool contiguous = false;
};

}  // namespace lockstep::runtime::cuda::kernels
