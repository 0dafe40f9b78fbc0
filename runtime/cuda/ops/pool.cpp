#include "lockstep/runtime/cuda/ops/pool.h"

#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/device_guard.h"
#include "lockstep/runtime/cuda/kernels/pool.h"
#include "lockstep/runtime/cuda/tensor_args.h"

namespace lockstep::runtime::cuda {

namespace {

kernels::Pool2dShape kernel_shape(const PoolShape& s) {
  kernels::Pool2dShape k;
  k.planes = s.planes, k.h = s.h, k.w = s.w;
  k.kh = s.kh, k.kw = s.kw, k.sh = s.sh, k.sw = s.sw, k.ph = s.ph, k.pw = s.pw;
  k.oh = s.oh, k.ow = s.ow;
  return k;
}

// Both tensors contiguous, on the device of `out`, `out` floating.
void check(const char* op, const Tensor& in, const Tensor& out) {
  LOCKSTEP_CHECK(is_floating(out.dtype()), "{}: needs a floating tensor (f32, f64, bf16, f16), "
                 "got {}", op, dtype_name(out.dtype()));
  check_device(op, out.device(), {&in});
  LOCKSTEP_CHECK(in.is_contiguous() && out.is_contiguous(),
                 "{}: internal error, operands must be contiguous", op);
}

}  // namespace

void max_pool2d_forward(const PoolShape& s, const Tensor& x, const Tensor& y,
                        const Tensor& argmax) {
  check("max_pool2d", x, y);
  DeviceGuard guard(x.device().index);
  LOCKSTEP_CUDA_CHECK(kernels::max_pool2d_forward(scalar_type(x.dtype()), kernel_shape(s),
                                                  x.raw_data(), y.raw_data(),
                                                  argmax.data_ptr<int32_t>(), stream_of(x)));
}

void max_pool2d_backward(const PoolShape& s, const Tensor& grad_y, const Tensor& argmax,
                         const Tensor& grad_x) {
  check("max_pool2d backward", grad_y, grad_x);
  DeviceGuard guard(grad_x.device().index);
  LOCKSTEP_CUDA_CHECK(kernels::max_pool2d_backward(
      scalar_type(grad_x.dtype()), kernel_shape(s), grad_y.raw_data(),
      argmax.data_ptr<int32_t>(), grad_x.raw_data(), stream_of(grad_x)));
}

void avg_pool2d_forward(const PoolShape& s, bool adaptive, const Tensor& x, const Tensor& y) {
  check(adaptive ? "adaptive_avg_pool2d" : "avg_pool2d", x, y);
  DeviceGuard guard(x.device().index);
  LOCKSTEP_CUDA_CHECK(kernels::avg_pool2d_forward(scalar_type(x.dtype()), adaptive,
                                                  kernel_shape(s), x.raw_data(), y.raw_data(),
                                                  stream_of(x)));
}

void avg_pool2d_backward(const PoolShape& s, bool adaptive, const Tensor& grad_y,
                         const Tensor& grad_x) {
  check(adaptive ? "adaptive_avg_pool2d backward" : "avg_pool2d backward", grad_y, grad_x);
  DeviceGuard guard(grad_x.device().index);
  LOCKSTEP_CUDA_CHECK(kernels::avg_pool2d_backward(scalar_type(grad_x.dtype()), adaptive,
                                                   kernel_shape(s), grad_y.raw_data(),
                                                   grad_x.raw_data(), stream_of(grad_x)));
}

}  // namespace lockstep::runtime::cuda
