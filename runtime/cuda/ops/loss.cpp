#include "lockstep/runtime/cuda/ops/loss.h"

#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/device_guard.h"
#include "lockstep/runtime/cuda/kernels/softmax_loss.h"
#include "lockstep/runtime/cuda/ops/reduce.h"
#include "lockstep/runtime/cuda/tensor_args.h"

namespace lockstep::runtime::cuda {

namespace {

kernels::CrossEntropyArgs kernel_args(const Tensor& x, const Tensor& t, double smoothing,
                                      std::optional<int64_t> ignore_index, Reduction reduction) {
  LOCKSTEP_CHECK(!ignore_index || reduction == Reduction::None,
                 "cross_entropy on CUDA: ignore_index comes with Reduction::None only");
  kernels::CrossEntropyArgs a;
  a.ignores = ignore_index.has_value();
  a.ignore_index = ignore_index.value_or(0);
  a.logits = x.raw_data();
  a.dtype = scalar_type(x.dtype());
  a.target = t.data_ptr<int64_t>();
  a.n = x.size(0);
  a.c = x.size(1);
  a.smoothing = smoothing;
  return a;
}

}  // namespace

LossForward cross_entropy_forward(const Tensor& x, const Tensor& t, double smoothing,
                                  Reduction reduction, std::optional<int64_t> ignore_index) {
  LOCKSTEP_CHECK(is_floating(x.dtype()),
                 "cross_entropy: logits must be floating (f32, f64, bf16, f16), got {}",
                 dtype_name(x.dtype()));
  check_device("cross_entropy", x.device(), {&t});
  const Device device = x.device();
  const int64_t n = x.size(0);
  const DType compute = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const bool per_row = reduction == Reduction::None;
  Tensor lse = Tensor::empty({n}, compute, device);
  Tensor losses = Tensor::empty({n}, per_row ? x.dtype() : compute, device);
  DeviceGuard guard(device.index);
  LOCKSTEP_CUDA_CHECK(kernels::cross_entropy_forward(kernel_args(x, t, smoothing, ignore_index,
                                                                 reduction),
                                                     losses.raw_data(),
                                                     scalar_type(losses.dtype()),
                                                     lse.raw_data(), stream_of(x)));
  Tensor out = losses;
  if (!per_row) {
    const double scale = reduction == Reduction::Mean ? 1.0 / static_cast<double>(n) : 1.0;
    out = cuda::sum(losses, {0}, scale, x.dtype()).reshape({});
  }
  return {out, {x, t, lse}};
}

Tensor cross_entropy_backward(const std::vector<Tensor>& saved, const Tensor& grad,
                              double smoothing, Reduction reduction,
                              std::optional<int64_t> ignore_index) {
  const Tensor &x = saved[0], &t = saved[1], &lse = saved[2];
  check_device("cross_entropy backward", x.device(), {&grad});
  const Tensor gy = grad.to(x.dtype()).contiguous();
  Tensor gx = Tensor::empty(x.shape(), x.dtype(), x.device());
  const bool per_row = reduction == Reduction::None;
  const double divisor = reduction == Reduction::Mean ? static_cast<double>(x.size(0)) : 1.0;
  DeviceGuard guard(x.device().index);
  LOCKSTEP_CUDA_CHECK(kernels::cross_entropy_backward(kernel_args(x, t, smoothing, ignore_index,
                                                                  reduction),
                                                      lse.raw_data(), gy.raw_data(), per_row,
                                                      divisor, gx.raw_data(), stream_of(x)));
  return gx;
}

}  // namespace lockstep::runtime::cuda
