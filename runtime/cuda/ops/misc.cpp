#include "lockstep/runtime/cuda/ops/misc.h"

#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/device_guard.h"
#include "lockstep/runtime/cuda/kernels/misc.h"
#include "lockstep/runtime/cuda/tensor_args.h"

namespace lockstep::runtime::cuda {

namespace {

void check_float(const char* op, DType dtype) {
  LOCKSTEP_CHECK(is_floating(dtype), "{}: needs a floating tensor (f32, f64, bf16, f16), got {}",
                 op, dtype_name(dtype));
}

}  // namespace

void dropout_forward(const Tensor& x, const Tensor& y, const Tensor& mask, uint64_t threshold,
                     double scale, Generator& g) {
  check_float("dropout", x.dtype());
  const int64_t n = x.numel();
  const uint64_t offset = g.reserve(static_cast<uint64_t>(n));  // the draws this op consumes
  DeviceGuard guard(x.device().index);
  LOCKSTEP_CUDA_CHECK(kernels::dropout_forward(scalar_type(x.dtype()), x.raw_data(),
                                               y.raw_data(), mask.data_ptr<uint8_t>(), n,
                                               g.seed(), offset, threshold, scale,
                                               stream_of(x)));
}

void dropout_backward(const Tensor& grad_y, const Tensor& mask, double scale,
                      const Tensor& grad_x) {
  check_float("dropout backward", grad_y.dtype());
  check_device("dropout backward", mask.device(), {&grad_y, &grad_x});
  DeviceGuard guard(grad_x.device().index);
  LOCKSTEP_CUDA_CHECK(kernels::dropout_backward(scalar_type(grad_y.dtype()), grad_y.raw_data(),
                                                mask.data_ptr<uint8_t>(), grad_x.raw_data(),
                                                grad_y.numel(), scale, stream_of(grad_x)));
}

void embedding_forward(const Tensor& indices, const Tensor& weight, const Tensor& out) {
  DeviceGuard guard(weight.device().index);
  const size_t row_bytes = static_cast<size_t>(weight.size(1)) * weight.element_size();
  LOCKSTEP_CUDA_CHECK(kernels::embedding_forward(indices.raw_data(),
                                                 scalar_type(indices.dtype()), indices.numel(),
                                                 weight.raw_data(), weight.size(0), row_bytes,
                                                 out.raw_data(), stream_of(weight)));
}

Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t rows, int64_t dim,
                          int64_t padding_idx) {
  check_float("embedding backward", grad.dtype());
  check_device("embedding backward", indices.device(), {&grad});
  const Tensor g = grad.contiguous();
  const DType acc = g.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor gw = Tensor::zeros({rows, dim}, acc, indices.device());
  DeviceGuard guard(gw.device().index);
  LOCKSTEP_CUDA_CHECK(kernels::embedding_backward(scalar_type(g.dtype()), g.raw_data(),
                                                  indices.raw_data(),
                                                  scalar_type(indices.dtype()), indices.numel(),
                                                  rows, dim, padding_idx, gw.raw_data(),
                                                  stream_of(gw)));
  return gw.to(g.dtype());
}

}  // namespace lockstep::runtime::cuda
