#include "lockstep/runtime/device_backend.h"

#include <fmt/format.h>

#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops/sync_batch_norm.h"

namespace lockstep::runtime {

void DeviceBackend::missing(std::string_view what) const {
  throw Error(fmt::format("{}: lockstep was built without CUDA (configure with "
                          "-DLOCKSTEP_CUDA=ON where the CUDA toolkit is installed); use the CPU",
                          what));
}

GpuInventory DeviceBackend::probe() const { return {}; }

void DeviceBackend::set_current(int index) const {
  missing(fmt::format("cannot use cuda:{}", index));
}

std::shared_ptr<void> DeviceBackend::make_current(Device device) const {
  missing(fmt::format("cannot use {}", device.str()));
}

std::unique_ptr<DeviceMarks> DeviceBackend::timing_marks(Device device) const {
  missing(fmt::format("time {}", device.str()));
}

std::unique_ptr<DeviceActivityTrace> DeviceBackend::trace_activity() const {
  missing("trace device activity");
}

void DeviceBackend::synchronize(Device device) const {
  missing(fmt::format("synchronize {}", device.str()));
}
std::string DeviceBackend::name(Device device) const {
  missing(fmt::format("name {}", device.str()));
}
std::string DeviceBackend::physical_id(Device) const { return {}; }
void DeviceBackend::set_allow_tf32(bool) const { missing("TF32"); }
void DeviceBackend::set_cudnn_benchmark(bool) const { missing("cuDNN benchmark mode"); }
size_t DeviceBackend::peak_allocated_bytes(Device device) const {
  missing(fmt::format("peak memory of {}", device.str()));
}
void DeviceBackend::reset_peak_memory(Device device) const {
  missing(fmt::format("peak memory of {}", device.str()));
}

void* DeviceBackend::allocate(size_t nbytes, Device device) const {
  missing(fmt::format("cannot allocate {} bytes on {}", nbytes, device.str()));
}

void DeviceBackend::free(void*, Device) const { missing("free device memory"); }

void DeviceBackend::copy(const Tensor&, const Tensor&) const { missing("copy_"); }
void DeviceBackend::fill(const Tensor&, double) const { missing("fill_"); }
void DeviceBackend::add_into(const Tensor&, const Tensor&, double) const { missing("add_"); }
void DeviceBackend::mul_into(const Tensor&, const Tensor&) const { missing("mul_"); }
void DeviceBackend::mul_scalar_into(const Tensor&, double) const { missing("mul_"); }
void DeviceBackend::scale_into(const Tensor&, const Tensor&, double) const {
  missing("scale_into");
}

Tensor DeviceBackend::binary(BinaryOp, const Tensor&, const Tensor&, DType, double,
                             const char* name) const {
  missing(name);
}
Tensor DeviceBackend::unary(UnaryOp, const Tensor&, double, const char* name) const {
  missing(name);
}

Tensor DeviceBackend::sum(const Tensor&, const std::vector<int64_t>&, double, DType) const {
  missing("sum");
}
ValuesAndIndices DeviceBackend::max_along(const Tensor&, int64_t, bool) const { missing("max"); }
Tensor DeviceBackend::max_backward(const Tensor&, const Tensor&, const Shape&, int64_t,
                                   DType) const {
  missing("max backward");
}

void DeviceBackend::gemm(const Tensor&, const Tensor&, Tensor&, double, double) const {
  missing("matmul");
}
void DeviceBackend::gemm_batched(const Tensor&, const Tensor&, Tensor&) const {
  missing("bmm");
}
Tensor DeviceBackend::sum_rows(const Tensor&) const { missing("linear backward"); }

Tensor DeviceBackend::softmax_forward(const Tensor&, int64_t, bool log) const {
  missing(log ? "log_softmax" : "softmax");
}
Tensor DeviceBackend::softmax_backward(const Tensor&, const Tensor&, int64_t, bool log) const {
  missing(log ? "log_softmax backward" : "softmax backward");
}

void DeviceBackend::dropout_forward(const Tensor&, const Tensor&, const Tensor&, uint64_t, double,
                                    Generator&) const {
  missing("dropout");
}
void DeviceBackend::dropout_backward(const Tensor&, const Tensor&, double, const Tensor&) const {
  missing("dropout backward");
}
void DeviceBackend::embedding_forward(const Tensor&, const Tensor&, const Tensor&) const {
  missing("embedding");
}
Tensor DeviceBackend::embedding_backward(const Tensor&, const Tensor&, int64_t, int64_t,
                                         int64_t) const {
  missing("embedding backward");
}

void DeviceBackend::max_pool2d_forward(const pool_kernels::PoolShape&, const Tensor&,
                                       const Tensor&, const Tensor&) const {
  missing("max_pool2d");
}
void DeviceBackend::max_pool2d_backward(const pool_kernels::PoolShape&, const Tensor&,
                                        const Tensor&, const Tensor&) const {
  missing("max_pool2d backward");
}
void DeviceBackend::avg_pool2d_forward(const pool_kernels::PoolShape&, bool, const Tensor&,
                                       const Tensor&) const {
  missing("avg_pool2d");
}
void DeviceBackend::avg_pool2d_backward(const pool_kernels::PoolShape&, bool, const Tensor&,
                                        const Tensor&) const {
  missing("avg_pool2d backward");
}

void DeviceBackend::fused_sgd_step(const std::vector<FusedParam<SgdTensor>>&) const {
  missing("SGD.step");
}
void DeviceBackend::fused_adam_step(const std::vector<FusedParam<AdamTensor>>&) const {
  missing("Adam.step");
}

void DeviceBackend::amp_unscale(const std::vector<Tensor>&, const Tensor&, const Tensor&) const {
  missing("unscale gradients");
}
void DeviceBackend::amp_update_scale(const Tensor&, const Tensor&, const Tensor&, double, double,
                                     int64_t) const {
  missing("update the loss scale");
}

Tensor DeviceBackend::sync_bn_local_stats(const Tensor&) const { missing("SyncBatchNorm"); }
sync_bn::Combined DeviceBackend::sync_bn_combine(const Tensor&, int, DType, const Tensor&,
                                                 const Tensor&, const Tensor&, const Tensor&,
                                                 double, double) const {
  missing("SyncBatchNorm");
}
Tensor DeviceBackend::sync_bn_affine(const Tensor&, const Tensor&, const Tensor&) const {
  missing("SyncBatchNorm");
}
sync_bn::GradSums DeviceBackend::sync_bn_grad_sums(const Tensor&, const Tensor&, const Tensor&,
                                                   bool, bool) const {
  missing("SyncBatchNorm backward");
}
Tensor DeviceBackend::sync_bn_grad_input(const Tensor&, const Tensor&, const Tensor&,
                                         const Tensor&, const Tensor&) const {
  missing("SyncBatchNorm backward");
}

void DeviceBackend::conv2d_forward(const conv_kernels::ConvShape&, const Tensor&, const Tensor&,
                                   const Tensor&, Tensor&) const {
  missing("conv2d");
}
void DeviceBackend::conv2d_backward(const conv_kernels::ConvShape&, const Tensor&, const Tensor&,
                                    const Tensor&, Tensor&, Tensor&, Tensor&) const {
  missing("conv2d backward");
}
NormStats DeviceBackend::layer_norm_forward(const Tensor&, const Tensor&, const Tensor&, int64_t,
                                           int64_t, double, Tensor&) const {
  missing("layer_norm");
}
void DeviceBackend::layer_norm_backward(const Tensor&, const Tensor&, const Tensor&,
                                        const NormStats&, int64_t, int64_t, Tensor&, Tensor&,
                                        Tensor&) const {
  missing("layer_norm backward");
}
NormStats DeviceBackend::batch_norm_forward(const Tensor&, const Tensor&, const Tensor&,
                                            const Tensor&, const Tensor&, bool, double, double,
                                            Tensor&) const {
  missing("batch_norm");
}
void DeviceBackend::batch_norm_backward(const Tensor&, const Tensor&, const Tensor&,
                                        const NormStats&, bool, double, Tensor&, Tensor&,
                                        Tensor&) const {
  missing("batch_norm backward");
}
LossForward DeviceBackend::cross_entropy_forward(const Tensor&, const Tensor&, double,
                                                 Reduction, std::optional<int64_t>) const {
  missing("cross_entropy");
}
Tensor DeviceBackend::cross_entropy_backward(const std::vector<Tensor>&, const Tensor&, double,
                                             Reduction, std::optional<int64_t>) const {
  missing("cross_entropy backward");
}

CurrentDevice::CurrentDevice(Device device) {
  if (!device.is_cpu()) guard_ = device_backend(device).make_current(device);
}

const DeviceBackend& device_backend(Device device) {
  LOCKSTEP_CHECK(device.is_cuda(), "no device backend for {}: the CPU's kernels are the ops' own",
                 device.str());
  static const DeviceBackend without_cuda;
  const DeviceBackend* cuda = registered_cuda_backend();
  return cuda != nullptr ? *cuda : without_cuda;
}

}  // namespace lockstep::runtime
