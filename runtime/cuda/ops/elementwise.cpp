#include "lockstep/runtime/cuda/ops/elementwise.h"

#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/device_guard.h"
#include "lockstep/runtime/cuda/tensor_args.h"
#include "lockstep/runtime/ops/elementwise.h"

namespace lockstep::runtime::cuda {

namespace {

bool is_comparison(kernels::BinaryOp op) {
  using enum kernels::BinaryOp;
  return op == eq || op == ne || op == gt || op == ge || op == lt || op == le;
}

// `t` on `device` in `dtype`. A 0-dim CPU tensor is a scalar operand: it is
// made on the device by a fill kernel, since a copy from pageable host memory
// may block the host. Its value is converted on the host first, as the CPU
// converts it: 1e5 becomes an f16 infinity, which fill_ alone would refuse.
Tensor operand(const Tensor& t, Device device, DType dtype, const char* name) {
  if (t.device() == device) return t.dtype() == dtype ? t : t.to(dtype);
  LOCKSTEP_CHECK(t.device().is_cpu() && t.dim() == 0,
                 "{}: operands on {} and {}; move one with .to(Device::parse(\"{}\"))", name,
                 t.device().str(), device.str(), device.str());
  return Tensor::full({}, t.detach().to(dtype).item(), dtype, device);
}

void check_dtype(const char* name, DType dtype, bool integers_ok) {
  const bool ok = is_floating(dtype) || (integers_ok && (dtype == DType::i32 || dtype == DType::i64));
  LOCKSTEP_CHECK(ok, "{}: dtype {} is not supported on CUDA; use {}", name, dtype_name(dtype),
                 integers_ok ? "f32, f64, bf16, f16, i32 or i64" : "f32, f64, bf16 or f16");
}

}  // namespace

Tensor binary_op(kernels::BinaryOp op, const Tensor& a, const Tensor& b, DType dtype, double alpha,
                 const char* name) {
  using enum kernels::BinaryOp;
  const bool arithmetic = op == add || op == sub || op == mul || op == div || op == maximum ||
                          op == minimum || is_comparison(op);
  check_dtype(name, dtype, arithmetic);
  const Device device = a.device().is_cuda() ? a.device() : b.device();
  const Tensor ca = operand(a, device, dtype, name);
  const Tensor cb = operand(b, device, dtype, name);
  const Shape shape = broadcast_shapes(ca.shape(), cb.shape());
  Tensor out = Tensor::empty(shape, is_comparison(op) ? DType::boolean : dtype, device);
  DeviceGuard guard(device.index);
  LOCKSTEP_CUDA_CHECK(
      kernels::binary(op, elementwise_args<3>(shape, {&out, &ca, &cb}), alpha, stream_of(out)));
  return out;
}

Tensor unary_op(kernels::UnaryOp op, const Tensor& a, double scalar, const char* name) {
  using enum kernels::UnaryOp;
  const bool integers_ok = op == neg || op == abs || op == add_scalar || op == mul_scalar ||
                           op == relu || op == sign;
  check_dtype(name, a.dtype(), integers_ok);
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  DeviceGuard guard(a.device().index);
  LOCKSTEP_CUDA_CHECK(
      kernels::unary(op, elementwise_args<2>(a.shape(), {&out, &a}), scalar, stream_of(out)));
  return out;
}

}  // namespace lockstep::runtime::cuda
