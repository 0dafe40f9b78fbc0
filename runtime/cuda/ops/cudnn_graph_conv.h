// conv2d forward, backward-data and backward-filter through cuDNN's graph
// (backend) API, each a graph of one convolution operation. cudnn_conv.cpp
// tries this first and falls back to cuDNN's legacy API where it says no.
//
// Plans are built once per key and cached for the process (the rules of
// engine choice and of the cache: cudnn_graph_plan.h). The key: the
// direction, geometry, dtype, device, TF32 mode, benchmark mode (the
// engines timed at the first run: cudnn_benchmark(), math_mode.h), the cuDNN
// handle and the byte alignment (up to 16) of each data pointer, which a
// plan may assume.
// Errors while executing a built plan are thrown, not hidden by a fallback.
#pragma once

#include <cudnn.h>

#include <cstdint>

#include "lockstep/runtime/cuda/ops/cudnn_graph_plan.h"
#include "lockstep/runtime/dtype.h"
#include "lockstep/runtime/ops/conv_kernels.h"

namespace lockstep::runtime::cuda {

enum class ConvDirection { forward, backward_data, backward_filter };

// Device pointers of one convolution, packed NCHW, one dtype: x the input
// side [n, c_in, h, w], w the weight [c_out, c_in / groups, kh, kw], y the
// output side [n, c_out, oh, ow]. forward writes y from x and w;
// backward_data writes x (the input gradient) from y (the output gradient)
// and w; backward_filter writes w (the weight gradient) from x and y.
struct ConvOperands {
  void* x = nullptr;
  void* w = nullptr;
  void* y = nullptr;
};

// Runs the convolution through the graph API on `handle` (the calling
// thread's for `device`, current; see cudnn_handle.h) and returns true; or
// returns false having run nothing, when the graph API is switched off or has
// no plan for this key: the caller then runs the legacy API. Throws
// lockstep::Error when executing a plan fails.
bool graph_conv(cudnnHandle_t handle, ConvDirection dir, const conv_kernels::ConvShape& s,
                DType dtype, int device, const ConvOperands& p);

// cuDNN convolutions run so far in this process, by API. Every graph_conv()
// call counts once: as graph when it ran the convolution, as legacy when it
// returned false (cudnn_legacy_forced() included). For tests.
CudnnPathStats conv_path_stats();

}  // namespace lockstep::runtime::cuda
