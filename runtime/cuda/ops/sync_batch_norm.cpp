#include "lockstep/runtime/cuda/ops/sync_batch_norm.h"

#include <cstdint>

#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/device_guard.h"
#include "lockstep/runtime/cuda/kernels/norm.h"
#include "lockstep/runtime/cuda/tensor_args.h"

namespace lockstep::runtime::cuda::sync_bn {
namespace {

// x viewed as [n, c, inner].
struct Dims {
  int64_t n = 0, c = 0, inner = 1;
};

Dims dims_of(const Tensor& x) {
  LOCKSTEP_CHECK(x.device().is_cuda() && x.is_contiguous() && x.dim() >= 2 &&
                     (x.dtype() == DType::f32 || x.dtype() == DType::f64),
                 "SyncBatchNorm on CUDA: expected a contiguous f32 or f64 CUDA tensor [N, C, "
                 "...], got {} {} on {}",
                 dtype_name(x.dtype()), shape_str(x.shape()), x.device().str());
  Dims d{x.size(0), x.size(1), 1};
  for (int64_t i = 2; i < x.dim(); ++i) d.inner *= x.size(i);
  return d;
}

// Scratch for the per-channel partial results of channel_stats/grad_sums.
Tensor workspace(const Dims& d, Device device) {
  const auto doubles = kernels::channel_reduce_workspace(d.n, d.c, d.inner) / sizeof(double);
  return Tensor::empty({static_cast<int64_t>(doubles)}, DType::f64, device);
}

// gy of backward: contiguous, like x.
void check_grad(const Tensor& gy, const Tensor& x) {
  LOCKSTEP_CHECK(gy.is_contiguous() && gy.shape() == x.shape() && gy.dtype() == x.dtype() &&
                     gy.device() == x.device(),
                 "SyncBatchNorm backward on CUDA: expected a contiguous gradient like the input "
                 "({} {}), got {} {} on {}",
                 dtype_name(x.dtype()), shape_str(x.shape()), dtype_name(gy.dtype()),
                 shape_str(gy.shape()), gy.device().str());
}

const void* data_or_null(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

// A running statistic as the combine kernel updates it: contiguous, of the
// data's dtype. The tensor itself when it already is, else a converted copy
// (write_back() then copies the update into the original).
Tensor stat_buffer(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype && t.is_contiguous()) return t.detach();
  return t.detach().to(dtype).contiguous();
}

void write_back(const Tensor& original, const Tensor& buffer) {
  if (buffer.storage() == original.storage()) {
    original.storage()->bump_version();  // the kernel wrote it in place
    return;
  }
  NoGradGuard no_grad;
  Tensor(original).copy_(buffer);
}

}  // namespace

Tensor local_stats(const Tensor& x) {
  const Dims d = dims_of(x);
  const Device dev = x.device();
  DeviceGuard guard(dev.index);
  Tensor local = Tensor::empty({2 * d.c + 1}, DType::f64, dev);
  const Tensor ws = workspace(d, dev);
  double* p = local.data_ptr<double>();
  LOCKSTEP_CUDA_CHECK(kernels::channel_stats(scalar_type(x.dtype()), d.n, d.c, d.inner,
                                             x.raw_data(), p, p + d.c, p + 2 * d.c,
                                             ws.raw_data(), stream_of(x)));
  return local;
}

Combined combine(const Tensor& gathered, int world, DType dtype, const Tensor& weight,
                 const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                 double momentum, double eps) {
  const Device dev = gathered.device();
  const int64_t c = world > 0 ? (gathered.numel() / world - 1) / 2 : 0;
  LOCKSTEP_CHECK(dev.is_cuda() && gathered.dtype() == DType::f64 && gathered.is_contiguous() &&
                     world > 0 && gathered.numel() == world * (2 * c + 1),
                 "SyncBatchNorm on CUDA: expected the gathered statistics as a contiguous f64 "
                 "CUDA tensor of {} x (2C + 1) values, got {} {} on {}",
                 world, dtype_name(gathered.dtype()), shape_str(gathered.shape()),
                 dev.str());
  check_device("SyncBatchNorm", dev, {&weight, &bias, &running_mean, &running_var});
  DeviceGuard guard(dev.index);
  const Tensor w = weight.defined() ? weight.detach().contiguous() : Tensor();
  const Tensor b = bias.defined() ? bias.detach().contiguous() : Tensor();
  Tensor rm, rv;
  if (running_mean.defined()) {
    rm = stat_buffer(running_mean, dtype);
    rv = stat_buffer(running_var, dtype);
  }
  Combined out{Tensor::empty({2 * c + 1}, DType::f64, dev), Tensor::empty({c}, dtype, dev),
               Tensor::empty({c}, dtype, dev)};
  LOCKSTEP_CUDA_CHECK(kernels::sync_batch_norm_combine(
      scalar_type(dtype), world, c, gathered.data_ptr<double>(), eps, momentum,
      data_or_null(w), data_or_null(b), rm.defined() ? rm.raw_data() : nullptr,
      rv.defined() ? rv.raw_data() : nullptr, out.stats.data_ptr<double>(),
      out.scale.raw_data(), out.shift.raw_data(), stream_of(gathered)));
  if (running_mean.defined()) {
    write_back(running_mean, rm);
    write_back(running_var, rv);
  }
  return out;
}

Tensor affine(const Tensor& x, const Tensor& scale, const Tensor& shift) {
  const Dims d = dims_of(x);
  const Device dev = x.device();
  check_device("SyncBatchNorm", dev, {&scale, &shift});
  DeviceGuard guard(dev.index);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), dev);
  LOCKSTEP_CUDA_CHECK(kernels::channel_affine(scalar_type(x.dtype()), d.n, d.c, d.inner,
                                              x.raw_data(), scale.raw_data(), shift.raw_data(),
                                              out.raw_data(), stream_of(x)));
  return out;
}

GradSums grad_sums(const Tensor& gy, const Tensor& x, const Tensor& stats, bool need_weight,
                   bool need_bias) {
  const Dims d = dims_of(x);
  const Device dev = x.device();
  check_grad(gy, x);
  check_device("SyncBatchNorm backward", dev, {&stats});
  DeviceGuard guard(dev.index);
  const DType dt = x.dtype();
  GradSums g;
  g.sums = Tensor::empty({2 * d.c}, DType::f64, dev);
  if (need_weight) g.grad_weight = Tensor::empty({d.c}, dt, dev);
  if (need_bias) g.grad_bias = Tensor::empty({d.c}, dt, dev);
  const Tensor ws = workspace(d, dev);
  const double* st = stats.data_ptr<double>();
  double* s = g.sums.data_ptr<double>();
  LOCKSTEP_CUDA_CHECK(kernels::channel_grad_sums(
      scalar_type(dt), d.n, d.c, d.inner, gy.raw_data(), x.raw_data(), st, st + d.c, s,
      s + d.c, need_weight ? g.grad_weight.raw_data() : nullptr,
      need_bias ? g.grad_bias.raw_data() : nullptr, ws.raw_data(), stream_of(x)));
  return g;
}

Tensor grad_input(const Tensor& gy, const Tensor& x, const Tensor& total, const Tensor& stats,
                  const Tensor& weight) {
  const Dims d = dims_of(x);
  const Device dev = x.device();
  check_grad(gy, x);
  check_device("SyncBatchNorm backward", dev, {&total, &stats, &weight});
  DeviceGuard guard(dev.index);
  const DType dt = x.dtype();
  const Tensor w = weight.defined() ? weight.detach().contiguous() : Tensor();
  const Tensor coef = Tensor::empty({3 * d.c}, dt, dev);
  const cudaStream_t stream = stream_of(x);
  LOCKSTEP_CUDA_CHECK(kernels::sync_batch_norm_coefficients(
      scalar_type(dt), d.c, total.data_ptr<double>(), stats.data_ptr<double>(), data_or_null(w),
      coef.raw_data(), stream));
  Tensor gx = Tensor::empty(x.shape(), dt, dev);
  LOCKSTEP_CUDA_CHECK(kernels::channel_grad_input(scalar_type(dt), d.n, d.c, d.inner,
                                                  gy.raw_data(), x.raw_data(), coef.raw_data(),
                                                  gx.raw_data(), stream));
  return gx;
}

}  // namespace lockstep::runtime::cuda::sync_bn
