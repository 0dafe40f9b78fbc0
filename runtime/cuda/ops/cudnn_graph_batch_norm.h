// batch_norm's training forward and backward through cuDNN's graph (backend)
// API: one norm-forward (training phase) or norm-backward operation in batch
// mode, statistics per channel over N and the spatial dims. cuda/ops/norm.cpp
// tries this first and falls back to cuDNN's legacy batch-norm calls where it
// says no; the two agree on what they save for backward (the batch mean and
// 1 / sqrt(biased var + eps)), so either backward follows either forward.
//
// f32 only: f64 goes to the legacy calls, as the graph would compute its
// statistics in f32. Data x, y, dy, dx is NCHW viewed as [n, c, inner, 1];
// per-channel tensors are [c] of f32. Plans are cached per (direction,
// geometry, running statistics or not, device, handle, pointer alignment);
// eps and momentum are passed by value at each call, so they are not part of
// the key (engine choice and cache rules: cudnn_graph_plan.h).
#pragma once

#include <cudnn.h>

#include <cstdint>

#include "lockstep/runtime/cuda/ops/cudnn_graph_plan.h"
#include "lockstep/runtime/dtype.h"

namespace lockstep::runtime::cuda {

// Device pointers of a training forward. The running statistics are all four
// given or all four null: then running_*_out = (1 - momentum) * running_*_in
// + momentum * batch statistic (the variance unbiased), into buffers apart
// from the inputs.
struct BatchNormForwardOperands {
  void* x = nullptr;
  void* scale = nullptr;
  void* bias = nullptr;
  void* y = nullptr;
  void* save_mean = nullptr;
  void* save_invstd = nullptr;
  void* running_mean_in = nullptr;
  void* running_var_in = nullptr;
  void* running_mean_out = nullptr;
  void* running_var_out = nullptr;
};

// Device pointers of a training backward: dx, dscale and dbias from x, dy,
// scale and the forward's saved statistics.
struct BatchNormBackwardOperands {
  void* x = nullptr;
  void* dy = nullptr;
  void* scale = nullptr;
  void* save_mean = nullptr;
  void* save_invstd = nullptr;
  void* dx = nullptr;
  void* dscale = nullptr;
  void* dbias = nullptr;
};

// Each runs its operation through the graph API on `handle` (the calling
// thread's for `device`, current; see cudnn_handle.h) and returns true; or
// returns false having run nothing (f64, the graph API switched off, or no
// plan for this key): the caller then runs the legacy call. n * inner > 0.
// Throws lockstep::Error when executing a plan fails.
bool graph_batch_norm_forward(cudnnHandle_t handle, int64_t n, int64_t c, int64_t inner,
                              DType dtype, int device, double momentum, double eps,
                              const BatchNormForwardOperands& p);
bool graph_batch_norm_backward(cudnnHandle_t handle, int64_t n, int64_t c, int64_t inner,
                               DType dtype, int device, const BatchNormBackwardOperands& p);

// Training batch norms (forward and backward calls) run so far in this
// process on cuDNN, by API: each graph_batch_norm_* call counts once. For
// tests.
CudnnPathStats batch_norm_path_stats();

}  // namespace lockstep::runtime::cuda
