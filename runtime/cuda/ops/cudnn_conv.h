// conv2d's CUDA kernels on cuDNN, reached through the CUDA backend from
// runtime/ops/conv.cpp, which checks the arguments, computes the geometry and
// records the autograd node for every device.
//
// Forward, backward-data and backward-filter go through cuDNN's graph API
// first (cudnn_graph_conv.h): one execution plan per key (direction,
// geometry, dtype, device, TF32 mode, handle, pointer alignment), chosen from
// cuDNN's heuristics and cached for the process. Where cuDNN cannot build a
// plan for a key, that key falls back, for good, to the legacy descriptor API
// (deprecated in cuDNN 9), whose algorithms come from cudnnGet*Algorithm_v7
// and are cached per (device, dtype, geometry, TF32 mode).
// LOCKSTEP_CUDNN_LEGACY=1 sends every convolution to the legacy API (read
// once). Neither path benchmarks: choosing runs nothing on the GPU.
//
// Workspaces come from the caching allocator on the current stream. f32 runs
// without TF32 unless allow_tf32() (math_mode.h); bf16 and f16 compute in
// f32 on tensor cores. Bias: cudnnAddTensor and cudnnConvolutionBackwardBias,
// except for bf16, which cuDNN's legacy tensor ops do not promise:
// lockstep's broadcast add_ and sum() there.
#pragma once

#include "lockstep/runtime/ops/conv_kernels.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime::cuda {

// out = conv2d(x, weight) + bias. x [n, c_in, h, w], weight
// [c_out, c_in / groups, kh, kw], bias [c_out] or undefined, out
// [n, c_out, oh, ow], all contiguous on one CUDA device with one dtype; `s` is
// their geometry, already checked.
void conv2d_forward(const conv_kernels::ConvShape& s, const Tensor& x, const Tensor& weight,
                    const Tensor& bias, Tensor& out);

// Writes each gradient that is defined (input, weight, bias) from gy, the
// contiguous gradient of out.
void conv2d_backward(const conv_kernels::ConvShape& s, const Tensor& x, const Tensor& weight,
                     const Tensor& gy, Tensor& grad_x, Tensor& grad_weight, Tensor& grad_bias);

}  // namespace lockstep::runtime::cuda
