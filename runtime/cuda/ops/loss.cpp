#include "lockstep/runtime/cuda/ops/loss.h"

#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/device_guard.h"
#include "lockstep/runtime/cuda/kernels/softmax_loss.h"
#include "lockstep/runtime/cuda/ops/reduce.h"
#include "lockstep/runtime/cuda/tensor_args.h"

namespace lockstep::runtime::cuda {

namespace {

kernels::CrossEntropyArgs kernel_args(const Tensor& x, const Tensor& t, double smoothing) {
  kernels::CrossEntropyArgs a;
  a.logits = x.raw_data();
  a.dtype = scalar_type(x.dtype());
  a.target = t.data_ptr<int64_t>();
  a.n = x.size(0);
  a.c = x.size(1);
  a.smoothing = smoothing;
  return a;
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& target, double smoothing,
                     Reduction reduction) {
  LOCKSTEP_CHECK(is_floating(logits.dtype()),
                 "cross_entropy: logits must be floating (f32, f64, bf16, f16), got {}",
                 dtype_name(logits.dtype()));
  check_device("cross_entropy", logits.device(), {&target});
  const Device device = logits.device();
  const int64_t n = logits.size(0);
  const Tensor x = logits.contiguous();
  const Tensor t = target.to(DType::i64).contiguous();
  const DType compute = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const bool per_row = reduction == Reduction::None;
  Tensor lse = Tensor::empty({n}, compute, device);
  Tensor losses = Tensor::empty({n}, per_row ? x.dtype() : compute, device);
  DeviceGuard guard(device.index);
  LOCKSTEP_CUDA_CHECK(kernels::cross_entropy_forward(kernel_args(x, t, smoothing),
                                                     losses.raw_data(),
                                                     scalar_type(losses.dtype()),
                                                     lse.raw_data(), stream_of(x)));
  Tensor out = losses;
  if (!per_row) {
    const double scale = reduction == Reduction::Mean ? 1.0 / static_cast<double>(n) : 1.0;
    out = cuda::sum(losses, {0}, scale, x.dtype()).reshape({});
  }
  return record(out, "CrossEntropyBackward", {logits}, {x, t, lse},
                [smoothing, reduction, n](const BackwardArgs& g) {
                  const Tensor &x = g.saved[0], &t = g.saved[1], &lse = g.saved[2];
                  check_device("cross_entropy backward", x.device(), {&g.grad});
                  const Tensor gy = g.grad.to(x.dtype()).contiguous();
                  Tensor gx = Tensor::empty(x.shape(), x.dtype(), x.device());
                  const bool per_row = reduction == Reduction::None;
                  const double divisor =
                      reduction == Reduction::Mean ? static_cast<double>(n) : 1.0;
                  DeviceGuard guard(x.device().index);
                  LOCKSTEP_CUDA_CHECK(kernels::cross_entropy_backward(
                      kernel_args(x, t, smoothing), lse.raw_data(), gy.raw_data(), per_row,
                      divisor, gx.raw_data(), stream_of(x)));
                  return std::vector<Tensor>{gx};
                });
}

}  // namespace lockstep::runtime::cuda
