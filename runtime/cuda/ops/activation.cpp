#include "lockstep/runtime/cuda/ops/activation.h"

#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/device_guard.h"
#include "lockstep/runtime/cuda/kernels/softmax_loss.h"
#include "lockstep/runtime/cuda/tensor_args.h"

namespace lockstep::runtime::cuda {

namespace {

// x (contiguous) seen as [outer, n, inner] around `dim`.
kernels::SoftmaxShape softmax_shape(const Tensor& x, int64_t dim) {
  kernels::SoftmaxShape s{1, 1, 1};
  for (int64_t d = 0; d < x.dim(); ++d) (d < dim ? s.outer : d == dim ? s.n : s.inner) *= x.size(d);
  return s;
}

void check_float(const char* op, DType dtype) {
  LOCKSTEP_CHECK(is_floating(dtype), "{}: needs a floating tensor (f32, f64, bf16, f16), got {}",
                 op, dtype_name(dtype));
}

}  // namespace

Tensor softmax_forward(const Tensor& x_in, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  check_float(op, x_in.dtype());
  dim = x_in.dim() == 0 ? 0 : wrap_dim(dim, x_in.dim());
  const Tensor x = x_in.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  DeviceGuard guard(x.device().index);
  LOCKSTEP_CUDA_CHECK(kernels::softmax_forward(scalar_type(x.dtype()), log, x.raw_data(),
                                               y.raw_data(), softmax_shape(x, dim),
                                               stream_of(x)));
  return y;
}

Tensor softmax_backward(const Tensor& y_in, const Tensor& grad, int64_t dim, bool log) {
  const char* op = log ? "log_softmax backward" : "softmax backward";
  check_float(op, y_in.dtype());
  check_device(op, y_in.device(), {&grad});
  dim = y_in.dim() == 0 ? 0 : wrap_dim(dim, y_in.dim());
  const Tensor y = y_in.contiguous();
  const Tensor g = grad.to(y.dtype()).contiguous();
  Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
  DeviceGuard guard(y.device().index);
  LOCKSTEP_CUDA_CHECK(kernels::softmax_backward(scalar_type(y.dtype()), log, y.raw_data(),
                                                g.raw_data(), dx.raw_data(),
                                                softmax_shape(y, dim), stream_of(y)));
  return dx;
}

}  // namespace lockstep::runtime::cuda
