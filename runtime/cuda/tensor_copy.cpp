#include "lockstep/runtime/cuda/tensor_copy.h"

#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/device_guard.h"
#include "lockstep/runtime/cuda/kernels/elementwise.h"
#include "lockstep/runtime/cuda/stream.h"
#include "lockstep/runtime/cuda/tensor_args.h"

namespace lockstep::runtime::cuda {

namespace {

// Same device, both CUDA: one conversion kernel (or a plain memcpy).
void copy_on_device(const Tensor& dst, const Tensor& src) {
  DeviceGuard guard(dst.device().index);
  LOCKSTEP_CUDA_CHECK(kernels::copy(elementwise_args<2>(dst.shape(), {&dst, &src}), stream_of(dst)));
}

// A contiguous tensor of src's values in `dtype`, broadcast to `shape`, on
// src's own device.
Tensor dense_like(const Tensor& src, const Shape& shape, DType dtype) {
  Tensor out = Tensor::empty(shape, dtype, src.device());
  if (src.device().is_cuda())
    copy_on_device(out, src);
  else
    out.copy_(src);
  return out;
}

void copy_host_to_device(const Tensor& dst, const Tensor& src) {
  // Convert and broadcast on the host, then one transfer of dst's bytes.
  Tensor host = src.dtype() == dst.dtype() && src.shape() == dst.shape() && src.is_contiguous()
                    ? src
                    : dense_like(src, dst.shape(), dst.dtype());
  const size_t bytes = host.numel() * host.element_size();
  DeviceGuard guard(dst.device().index);
  const cudaStream_t stream = stream_of(dst);
  if (dst.is_contiguous()) {
    // From pageable memory (every lockstep CPU tensor) the call returns once
    // CUDA has staged the bytes, so `host` may be freed right after.
    LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), host.raw_data(), bytes,
                                        cudaMemcpyHostToDevice, stream));
    return;
  }
  Tensor staged = Tensor::empty(dst.shape(), dst.dtype(), dst.device());
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(staged.raw_data(), host.raw_data(), bytes,
                                      cudaMemcpyHostToDevice, stream));
  copy_on_device(dst, staged);
}

void copy_device_to_host(const Tensor& dst, const Tensor& src) {
  // Convert, broadcast and pack on the device, then one transfer.
  const bool direct = dst.is_contiguous() && dst.dtype() == src.dtype() &&
                      dst.shape() == src.shape() && src.is_contiguous();
  Tensor packed = direct ? src : dense_like(src, dst.shape(), dst.dtype());
  Tensor host = dst.is_contiguous() ? dst : Tensor::empty(dst.shape(), dst.dtype());
  DeviceGuard guard(src.device().index);
  const cudaStream_t stream = stream_of(src);
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(host.raw_data(), packed.raw_data(),
                                      packed.numel() * packed.element_size(),
                                      cudaMemcpyDeviceToHost, stream));
  // The host reads the bytes next.
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (!host.is_same(dst)) {
    NoGradGuard no_grad;
    Tensor(dst).copy_(host);
  }
}

void copy_between_devices(const Tensor& dst, const Tensor& src) {
  Tensor packed = dense_like(src, dst.shape(), dst.dtype());
  Tensor landed = dst.is_contiguous() ? dst : Tensor::empty(dst.shape(), dst.dtype(), dst.device());
  {
    // The source's work must be done before the destination's stream reads
    // it. Under the source's device: its current stream may be the legacy
    // one, whose handle (null) names the legacy stream of the current device.
    DeviceGuard source(src.device().index);
    LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(stream_of(packed)));
  }
  DeviceGuard guard(dst.device().index);
  LOCKSTEP_CUDA_CHECK(cudaMemcpyPeerAsync(landed.raw_data(), dst.device().index, packed.raw_data(),
                                          src.device().index,
                                          packed.numel() * packed.element_size(), stream_of(dst)));
  // `packed` is freed on return: wait until the copy has read it.
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(stream_of(dst)));
  if (!landed.is_same(dst)) copy_on_device(dst, landed);
}

// `other` on dst's device in dst's dtype (a scalar CPU tensor, as the
// in-place ops make from a double, is moved over).
Tensor operand_on(const Tensor& dst, const Tensor& other) {
  LOCKSTEP_CHECK(dst.dtype() != DType::boolean && dst.dtype() != DType::u8,
                 "in-place arithmetic on a {} CUDA tensor; convert it first with .to(DType::f32)",
                 dtype_name(dst.dtype()));
  Tensor o = other.dtype() == dst.dtype() ? other : other.to(dst.dtype());
  return o.device() == dst.device() ? o : o.to(dst.device());
}

}  // namespace

void copy_tensor(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  if (dst.device() == src.device()) return copy_on_device(dst, src);
  if (src.device().is_cpu()) return copy_host_to_device(dst, src);
  if (dst.device().is_cpu()) return copy_device_to_host(dst, src);
  copy_between_devices(dst, src);
}

void fill_tensor(const Tensor& dst, double value) {
  DeviceGuard guard(dst.device().index);
  LOCKSTEP_CUDA_CHECK(kernels::fill(elementwise_args<1>(dst.shape(), {&dst}), value, stream_of(dst)));
}

void add_tensor(const Tensor& dst, const Tensor& other, double alpha) {
  const Tensor o = operand_on(dst, other);
  DeviceGuard guard(dst.device().index);
  LOCKSTEP_CUDA_CHECK(kernels::binary(kernels::BinaryOp::add,
                                      elementwise_args<3>(dst.shape(), {&dst, &dst, &o}), alpha,
                                      stream_of(dst)));
}

void mul_tensor(const Tensor& dst, const Tensor& other) {
  const Tensor o = operand_on(dst, other);
  DeviceGuard guard(dst.device().index);
  LOCKSTEP_CUDA_CHECK(kernels::binary(kernels::BinaryOp::mul,
                                      elementwise_args<3>(dst.shape(), {&dst, &dst, &o}), 1.0,
                                      stream_of(dst)));
}

void mul_scalar(const Tensor& dst, double factor) {
  DeviceGuard guard(dst.device().index);
  LOCKSTEP_CUDA_CHECK(kernels::unary(kernels::UnaryOp::mul_scalar,
                                     elementwise_args<2>(dst.shape(), {&dst, &dst}), factor,
                                     stream_of(dst)));
}

void scale_into(const Tensor& dst, const Tensor& src, double factor) {
  LOCKSTEP_CHECK(dst.device() == src.device() && dst.device().is_cuda() &&
                     dst.dtype() == src.dtype() && dst.numel() == src.numel(),
                 "scale_into: needs two CUDA tensors of one device, dtype and size; got {} {} {} "
                 "and {} {} {}",
                 dst.device().str(), dtype_name(dst.dtype()), shape_str(dst.shape()),
                 src.device().str(), dtype_name(src.dtype()), shape_str(src.shape()));
  // Same element count: view the source in the destination's shape.
  const Tensor s = src.shape() == dst.shape() ? src : src.reshape(dst.shape());
  DeviceGuard guard(dst.device().index);
  LOCKSTEP_CUDA_CHECK(kernels::unary(kernels::UnaryOp::mul_scalar,
                                     elementwise_args<2>(dst.shape(), {&dst, &s}), factor,
                                     stream_of(dst)));
}

}  // namespace lockstep::runtime::cuda
