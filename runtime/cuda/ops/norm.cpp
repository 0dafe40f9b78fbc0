// batch_norm's forward and backward kernels on cuDNN (training) and
// kernels/norm.cu (eval); layer_norm's on kernels/norm.cu. runtime/ops/norm.cpp
// records the autograd node around them.
#include "lockstep/runtime/cuda/ops/norm.h"

#include <climits>

#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/cuda/caching_allocator.h"
#include "lockstep/runtime/cuda/cudnn_check.h"
#include "lockstep/runtime/cuda/device_guard.h"
#include "lockstep/runtime/cuda/kernels/norm.h"
#include "lockstep/runtime/cuda/ops/cudnn_descriptors.h"
#include "lockstep/runtime/cuda/ops/cudnn_graph_batch_norm.h"
#include "lockstep/runtime/cuda/ops/cudnn_handle.h"
#include "lockstep/runtime/cuda/tensor_args.h"

namespace lockstep::runtime::cuda {
namespace {

int to_int(int64_t v, const char* op) {
  LOCKSTEP_CHECK(v >= 0 && v <= INT_MAX, "{} on CUDA: size {} does not fit cuDNN's 32-bit sizes",
                 op, v);
  return static_cast<int>(v);
}

// x viewed as [n, c, inner, 1] and the per-channel [1, c, 1, 1] parameters,
// for the legacy calls (32-bit sizes and strides).
struct BatchNormDescriptors {
  TensorDescriptor x, param;
  BatchNormDescriptors(DType dtype, int64_t n, int64_t c, int64_t inner)
      : x(cudnn_data_type(dtype, "batch_norm"), to_int(n, "batch_norm"), to_int(c, "batch_norm"),
          to_int(inner, "batch_norm"), 1),
        param(cudnn_data_type(dtype, "batch_norm"), 1, to_int(c, "batch_norm"), 1, 1) {
    LOCKSTEP_CHECK(n * c * inner <= INT_MAX,
                   "batch_norm on CUDA: {} elements exceed cuDNN's legacy 32-bit strides; split "
                   "the batch",
                   n * c * inner);
  }
};

// A running statistic as cuDNN reads and writes it: contiguous, of the data's
// dtype. The tensor itself when it already is, else a converted copy (then
// write_back() copies the update into the original).
Tensor stat_buffer(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype && t.is_contiguous()) return t.detach();
  return t.detach().to(dtype).contiguous();
}

void write_back(const Tensor& original, const Tensor& buffer) {
  if (buffer.storage() == original.storage()) {
    original.storage()->bump_version();  // cuDNN wrote it in place
    return;
  }
  NoGradGuard no_grad;
  Tensor(original).copy_(buffer);
}

}  // namespace

NormStats batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             const Tensor& running_mean, const Tensor& running_var,
                             bool training, double momentum, double eps, Tensor& out) {
  check_device("batch_norm", x.device(), {&x, &weight, &bias, &running_mean, &running_var, &out});
  const DType dt = x.dtype();
  LOCKSTEP_CHECK(dt == DType::f32 || dt == DType::f64,
                 "batch_norm on CUDA: dtype {} is not supported; use f32 or f64 (convert with "
                 ".to())",
                 dtype_name(dt));
  const Device dev = x.device();
  DeviceGuard guard(dev.index);
  const int64_t n = x.size(0), c = x.size(1), inner = n == 0 || c == 0 ? 0 : x.numel() / (n * c);
  // cuDNN always scales and shifts: ones and zeros stand in for missing ones.
  const Tensor w = weight.defined() ? weight.detach() : Tensor::ones({c}, dt, dev);
  const Tensor b = bias.defined() ? bias.detach() : Tensor::zeros({c}, dt, dev);

  if (!training) {
    // Copies: a later training step may update the running statistics in
    // place before this backward runs.
    NoGradGuard no_grad;
    NormStats stats{running_mean.detach().to(dt).clone(),
                    pow(running_var.detach().to(dt) + eps, -0.5)};
    LOCKSTEP_CUDA_CHECK(kernels::batch_norm_eval_forward(
        scalar_type(dt), n, c, inner, x.raw_data(), w.raw_data(), b.raw_data(),
        stats.mean.raw_data(), stats.invstd.raw_data(), out.raw_data(), stream_of(x)));
    return stats;
  }

  // The batch statistics, for backward (the op's checks make the batch non-empty).
  NormStats stats{Tensor::empty({c}, dt, dev), Tensor::empty({c}, dt, dev)};
  Tensor rm, rv;
  if (running_mean.defined()) {
    rm = stat_buffer(running_mean, dt);
    rv = stat_buffer(running_var, dt);
  }
  // The graph API writes updated running statistics into buffers of their
  // own; the legacy call updates rm and rv in place.
  Tensor rm_next, rv_next;
  if (rm.defined()) {
    rm_next = Tensor::empty({c}, dt, dev);
    rv_next = Tensor::empty({c}, dt, dev);
  }
  const cudnnHandle_t handle = cudnn_handle(dev.index);
  BatchNormForwardOperands p{x.raw_data(),          w.raw_data(),
                             b.raw_data(),          out.raw_data(),
                             stats.mean.raw_data(), stats.invstd.raw_data()};
  if (rm.defined()) {
    p.running_mean_in = rm.raw_data();
    p.running_var_in = rv.raw_data();
    p.running_mean_out = rm_next.raw_data();
    p.running_var_out = rv_next.raw_data();
  }
  if (!graph_batch_norm_forward(handle, n, c, inner, dt, dev.index, momentum, eps, p)) {
    const BatchNormDescriptors d(dt, n, c, inner);
    // factor = momentum: running = (1 - momentum) * running + momentum * batch.
    LOCKSTEP_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
        handle, CUDNN_BATCHNORM_SPATIAL, cudnn_one(dt), cudnn_zero(dt), d.x.get(), x.raw_data(),
        d.x.get(), out.raw_data(), d.param.get(), w.raw_data(), b.raw_data(), momentum,
        rm.defined() ? rm.raw_data() : nullptr, rv.defined() ? rv.raw_data() : nullptr, eps,
        stats.mean.raw_data(), stats.invstd.raw_data()));
    rm_next = rm;
    rv_next = rv;
  }
  if (rm.defined()) {
    write_back(running_mean, rm_next);
    write_back(running_var, rv_next);
  }
  return stats;
}

void batch_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight,
                         const NormStats& stats, bool training, double eps, Tensor& grad_x,
                         Tensor& grad_weight, Tensor& grad_bias) {
  const DType dt = x.dtype();
  const Device dev = x.device();
  DeviceGuard guard(dev.index);
  const int64_t n = x.size(0), c = x.size(1), inner = n == 0 || c == 0 ? 0 : x.numel() / (n * c);
  const Tensor gy = grad.to(dt).contiguous();  // the kernels read gy as dt
  if (training) {
    // cuDNN computes all three; dx needs the parameter gradients' sums anyway.
    const Tensor w = weight.defined() ? weight : Tensor::ones({c}, dt, dev);
    const Tensor gx = grad_x.defined() ? grad_x : Tensor::empty(x.shape(), dt, dev);
    const Tensor gw = grad_weight.defined() ? grad_weight : Tensor::empty({c}, dt, dev);
    const Tensor gb = grad_bias.defined() ? grad_bias : Tensor::empty({c}, dt, dev);
    const cudnnHandle_t handle = cudnn_handle(dev.index);
    const BatchNormBackwardOperands p{x.raw_data(),          gy.raw_data(),
                                      w.raw_data(),          stats.mean.raw_data(),
                                      stats.invstd.raw_data(), gx.raw_data(),
                                      gw.raw_data(),         gb.raw_data()};
    if (!graph_batch_norm_backward(handle, n, c, inner, dt, dev.index, p)) {
      const BatchNormDescriptors d(dt, n, c, inner);
      LOCKSTEP_CUDNN_CHECK(cudnnBatchNormalizationBackward(
          handle, CUDNN_BATCHNORM_SPATIAL, cudnn_one(dt), cudnn_zero(dt), cudnn_one(dt),
          cudnn_zero(dt), d.x.get(), x.raw_data(), d.x.get(), gy.raw_data(), d.x.get(),
          gx.raw_data(), d.param.get(), w.raw_data(), gw.raw_data(), gb.raw_data(), eps,
          stats.mean.raw_data(), stats.invstd.raw_data()));
    }
    return;
  }
  // Eval: the kernels write zeros for an empty batch.
  const cudaStream_t stream = stream_of(x);
  const kernels::ScalarType st = scalar_type(dt);
  if (grad_x.defined()) {
    LOCKSTEP_CUDA_CHECK(kernels::batch_norm_eval_backward_input(
        st, n, c, inner, gy.raw_data(), weight.defined() ? weight.raw_data() : nullptr,
        stats.invstd.raw_data(), grad_x.raw_data(), stream));
  }
  if (grad_weight.defined() || grad_bias.defined()) {
    LOCKSTEP_CUDA_CHECK(kernels::batch_norm_eval_backward_params(
        st, n, c, inner, gy.raw_data(), x.raw_data(), stats.mean.raw_data(),
        stats.invstd.raw_data(), grad_weight.defined() ? grad_weight.raw_data() : nullptr,
        grad_bias.defined() ? grad_bias.raw_data() : nullptr, stream));
  }
}

NormStats layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, int64_t rows,
                            int64_t d, double eps, Tensor& out) {
  check_device("layer_norm", x.device(), {&x, &w, &b, &out});
  const DType dt = x.dtype();
  LOCKSTEP_CHECK(is_floating(dt), "layer_norm on CUDA: dtype {} is not supported; use f32, f64, "
                 "bf16 or f16 (convert with .to())", dtype_name(dt));
  const Device dev = x.device();
  DeviceGuard guard(dev.index);
  const DType stat_dt = dt == DType::f64 ? DType::f64 : DType::f32;
  NormStats stats{Tensor::empty({rows}, stat_dt, dev), Tensor::empty({rows}, stat_dt, dev)};
  LOCKSTEP_CUDA_CHECK(kernels::layer_norm_forward(
      scalar_type(dt), rows, d, x.raw_data(), w.defined() ? w.raw_data() : nullptr,
      b.defined() ? b.raw_data() : nullptr, eps, out.raw_data(), stats.mean.raw_data(),
      stats.invstd.raw_data(), stream_of(x)));
  return stats;
}

void layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& w,
                         const NormStats& stats, int64_t rows, int64_t d, Tensor& grad_x,
                         Tensor& grad_weight, Tensor& grad_bias) {
  const DType dt = x.dtype();
  const Device dev = x.device();
  DeviceGuard guard(dev.index);
  const Tensor gy = grad.to(dt).contiguous();  // the kernels read gy as dt
  const cudaStream_t stream = stream_of(x);
  const kernels::ScalarType st = scalar_type(dt);
  if (grad_x.defined()) {
    LOCKSTEP_CUDA_CHECK(kernels::layer_norm_backward_input(
        st, rows, d, gy.raw_data(), x.raw_data(), w.defined() ? w.raw_data() : nullptr,
        stats.mean.raw_data(), stats.invstd.raw_data(), grad_x.raw_data(), stream));
  }
  if (grad_weight.defined() || grad_bias.defined()) {
    DeviceBuffer workspace(kernels::layer_norm_param_workspace(rows, d),
                           current_stream(dev.index));
    LOCKSTEP_CUDA_CHECK(kernels::layer_norm_backward_params(
        st, rows, d, gy.raw_data(), x.raw_data(), stats.mean.raw_data(), stats.invstd.raw_data(),
        grad_weight.defined() ? grad_weight.raw_data() : nullptr,
        grad_bias.defined() ? grad_bias.raw_data() : nullptr, workspace.data(), stream));
  }
}

}  // namespace lockstep::runtime::cuda
