// The CUDA backend: device_backend.h's one registration point for CUDA, each
// entry the kernel of runtime/cuda/ that does the work.
#include "lockstep/runtime/device_backend.h"

#include <algorithm>
#include <cstring>
#include <deque>

#include <fmt/format.h>

#include "lockstep/runtime/cuda/activity_trace.h"
#include "lockstep/runtime/cuda/caching_allocator.h"
#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/device_guard.h"
#include "lockstep/runtime/cuda/ops/activation.h"
#include "lockstep/runtime/cuda/ops/amp.h"
#include "lockstep/runtime/cuda/ops/cublas_matmul.h"
#include "lockstep/runtime/cuda/ops/cudnn_conv.h"
#include "lockstep/runtime/cuda/ops/elementwise.h"
#include "lockstep/runtime/cuda/ops/fused_optimizer.h"
#include "lockstep/runtime/cuda/ops/math_mode.h"
#include "lockstep/runtime/cuda/ops/loss.h"
#include "lockstep/runtime/cuda/ops/misc.h"
#include "lockstep/runtime/cuda/ops/norm.h"
#include "lockstep/runtime/cuda/ops/pool.h"
#include "lockstep/runtime/cuda/ops/reduce.h"
#include "lockstep/runtime/cuda/ops/sync_batch_norm.h"
#include "lockstep/runtime/cuda/stream.h"
#include "lockstep/runtime/cuda/tensor_copy.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops/fused_step.h"

namespace lockstep::runtime {
namespace {

class CudaMarks final : public DeviceMarks {
 public:
  explicit CudaMarks(int device) : device_(device), side_(device) {}

  void record(size_t mark) override { event(mark).record(cuda::current_stream(device_)); }
  void record_after_on_side(size_t mark, const std::function<void()>& queue_waits) override {
    cuda::StreamGuard on_side(side_);
    queue_waits();
    event(mark).record(side_);
  }
  void synchronize(size_t mark) override { event(mark).synchronize(); }
  double elapsed_ms(size_t from, size_t to) override {
    return event(from).elapsed_ms(event(to));
  }

 private:
  cuda::Event& event(size_t mark) {
    while (events_.size() <= mark) events_.emplace_back(cuda::EventOptions{.timing = true});
    return events_[mark];
  }

  int device_;
  cuda::Stream side_;  // waits for what record_after_on_side queues, nothing else
  std::deque<cuda::Event> events_;  // a deque: growing never moves a recorded event
};

template <class Entry>
void launch_fused(const std::vector<FusedParam<Entry>>& params) {
  cuda::FusedLaunch<Entry> launch;
  for (const FusedParam<Entry>& p : params) launch.add(p.param, p.grad, p.entry);
  launch.launch();
}

class CudaBackend final : public DeviceBackend {
 public:
  GpuInventory probe() const override {
    GpuInventory gpus{.cuda_built = true, .count = cuda_device_count()};
    if (gpus.count == 0) gpus.unavailable_reason = cuda_unavailable_reason();
    return gpus;
  }
  void set_current(int index) const override { LOCKSTEP_CUDA_CHECK(cudaSetDevice(index)); }
  std::shared_ptr<void> make_current(Device device) const override {
    return std::make_shared<cuda::DeviceGuard>(device.index);
  }
  std::unique_ptr<DeviceMarks> timing_marks(Device device) const override {
    return std::make_unique<CudaMarks>(device.index);
  }
  std::unique_ptr<DeviceActivityTrace> trace_activity() const override {
    return cuda::start_activity_trace();
  }
  void synchronize(Device device) const override {
    cuda::DeviceGuard guard(device.index);
    LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::string name(Device device) const override {
    cudaDeviceProp props{};
    LOCKSTEP_CUDA_CHECK(cudaGetDeviceProperties(&props, device.index));
    return props.name;
  }
  std::string physical_id(Device device) const override {
    // Called before the rank has used its device (init_process_group): a
    // device it cannot see is reported when it does, not here.
    try {
      if (device.index < 0 || device.index >= cuda_device_count()) return {};
    } catch (const Error&) {
      return {};
    }
    cudaDeviceProp props{};
    if (cudaGetDeviceProperties(&props, device.index) != cudaSuccess) {
      cudaGetLastError();
      return {};
    }
    unsigned char b[16];
    std::memcpy(b, props.uuid.bytes, sizeof b);
    if (std::any_of(b, b + 16, [](unsigned char x) { return x != 0; })) {
      return fmt::format("GPU-{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-"
                         "{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
                         b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
                         b[12], b[13], b[14], b[15]);
    }
    char bus_id[32] = {};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device.index) != cudaSuccess) {
      cudaGetLastError();
      return {};
    }
    return bus_id;
  }
  void set_allow_tf32(bool allow) const override { cuda::set_allow_tf32(allow); }
  void set_cudnn_benchmark(bool on) const override { cuda::set_cudnn_benchmark(on); }
  size_t peak_allocated_bytes(Device device) const override {
    return cuda::memory_stats(device.index).peak_allocated_bytes;
  }
  void reset_peak_memory(Device device) const override {
    cuda::reset_peak_memory_stats(device.index);
  }

  // From the caching allocator, for use on the device's current stream
  // (where ops queue their kernels).
  void* allocate(size_t nbytes, Device device) const override {
    if (nbytes == 0) return nullptr;
    const int count = cuda_device_count();
    LOCKSTEP_CHECK(count > 0, "cannot allocate {} bytes on {}: {}", nbytes, device.str(),
                   cuda_unavailable_reason());
    LOCKSTEP_CHECK(device.index >= 0 && device.index < count,
                   "cannot allocate on {}: this process sees {} CUDA device(s) (cuda:0 to "
                   "cuda:{}); check the device index and CUDA_VISIBLE_DEVICES",
                   device.str(), count, count - 1);
    return cuda::device_alloc(nbytes, cuda::current_stream(device.index));
  }
  void free(void* data, Device) const override { cuda::device_free(data); }

  void copy(const Tensor& dst, const Tensor& src) const override { cuda::copy_tensor(dst, src); }
  void fill(const Tensor& dst, double value) const override { cuda::fill_tensor(dst, value); }
  void add_into(const Tensor& dst, const Tensor& other, double alpha) const override {
    cuda::add_tensor(dst, other, alpha);
  }
  void mul_into(const Tensor& dst, const Tensor& other) const override {
    cuda::mul_tensor(dst, other);
  }
  void mul_scalar_into(const Tensor& dst, double factor) const override {
    cuda::mul_scalar(dst, factor);
  }
  void scale_into(const Tensor& dst, const Tensor& src, double factor) const override {
    cuda::scale_into(dst, src, factor);
  }

  Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b, DType dtype, double alpha,
                const char* name) const override {
    return cuda::binary_op(op, a, b, dtype, alpha, name);
  }
  Tensor unary(UnaryOp op, const Tensor& a, double scalar, const char* name) const override {
    return cuda::unary_op(op, a, scalar, name);
  }

  Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, double scale,
             DType out_dtype) const override {
    return cuda::sum(a, dims, scale, out_dtype);
  }
  ValuesAndIndices max_along(const Tensor& a, int64_t dim, bool want_values) const override {
    cuda::MaxAlong m = cuda::max_along(a, dim, want_values);
    return {std::move(m.values), std::move(m.indices)};
  }
  Tensor max_backward(const Tensor& grad, const Tensor& indices, const Shape& in_shape,
                      int64_t dim, DType dtype) const override {
    return cuda::max_backward(grad, indices, in_shape, dim, dtype);
  }

  void gemm(const Tensor& a, const Tensor& b, Tensor& c, double alpha,
            double beta) const override {
    cuda::gemm(a, b, c, alpha, beta);
  }
  void gemm_batched(const Tensor& a, const Tensor& b, Tensor& out) const override {
    cuda::gemm_batched(a, b, out);
  }
  Tensor sum_rows(const Tensor& x) const override { return cuda::sum_rows(x); }

  Tensor softmax_forward(const Tensor& x, int64_t dim, bool log) const override {
    return cuda::softmax_forward(x, dim, log);
  }
  Tensor softmax_backward(const Tensor& y, const Tensor& grad, int64_t dim,
                          bool log) const override {
    return cuda::softmax_backward(y, grad, dim, log);
  }

  void dropout_forward(const Tensor& x, const Tensor& y, const Tensor& mask, uint64_t threshold,
                       double scale, Generator& g) const override {
    cuda::dropout_forward(x, y, mask, threshold, scale, g);
  }
  void dropout_backward(const Tensor& grad_y, const Tensor& mask, double scale,
                        const Tensor& grad_x) const override {
    cuda::dropout_backward(grad_y, mask, scale, grad_x);
  }
  void embedding_forward(const Tensor& indices, const Tensor& weight,
                         const Tensor& out) const override {
    cuda::embedding_forward(indices, weight, out);
  }
  Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t rows,
                            int64_t dim, int64_t padding_idx) const override {
    return cuda::embedding_backward(grad, indices, rows, dim, padding_idx);
  }

  void max_pool2d_forward(const pool_kernels::PoolShape& s, const Tensor& x, const Tensor& y,
                          const Tensor& argmax) const override {
    cuda::max_pool2d_forward(s, x, y, argmax);
  }
  void max_pool2d_backward(const pool_kernels::PoolShape& s, const Tensor& grad_y,
                           const Tensor& argmax, const Tensor& grad_x) const override {
    cuda::max_pool2d_backward(s, grad_y, argmax, grad_x);
  }
  void avg_pool2d_forward(const pool_kernels::PoolShape& s, bool adaptive, const Tensor& x,
                          const Tensor& y) const override {
    cuda::avg_pool2d_forward(s, adaptive, x, y);
  }
  void avg_pool2d_backward(const pool_kernels::PoolShape& s, bool adaptive,
                           const Tensor& grad_y, const Tensor& grad_x) const override {
    cuda::avg_pool2d_backward(s, adaptive, grad_y, grad_x);
  }

  void fused_sgd_step(const std::vector<FusedParam<SgdTensor>>& params) const override {
    launch_fused(params);
  }
  void fused_adam_step(const std::vector<FusedParam<AdamTensor>>& params) const override {
    launch_fused(params);
  }

  void amp_unscale(const std::vector<Tensor>& grads, const Tensor& found_inf,
                   const Tensor& inv_scale) const override {
    cuda::amp_unscale(grads, found_inf, inv_scale);
  }
  void amp_update_scale(const Tensor& scale, const Tensor& growth_tracker,
                        const Tensor& found_inf, double growth_factor, double backoff_factor,
                        int64_t growth_interval) const override {
    cuda::amp_update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                           growth_interval);
  }

  Tensor sync_bn_local_stats(const Tensor& x) const override {
    return cuda::sync_bn::local_stats(x);
  }
  sync_bn::Combined sync_bn_combine(const Tensor& gathered, int world, DType dtype,
                                    const Tensor& weight, const Tensor& bias,
                                    const Tensor& running_mean, const Tensor& running_var,
                                    double momentum, double eps) const override {
    return cuda::sync_bn::combine(gathered, world, dtype, weight, bias, running_mean,
                                  running_var, momentum, eps);
  }
  Tensor sync_bn_affine(const Tensor& x, const Tensor& scale,
                        const Tensor& shift) const override {
    return cuda::sync_bn::affine(x, scale, shift);
  }
  sync_bn::GradSums sync_bn_grad_sums(const Tensor& gy, const Tensor& x, const Tensor& stats,
                                      bool need_weight, bool need_bias) const override {
    return cuda::sync_bn::grad_sums(gy, x, stats, need_weight, need_bias);
  }
  Tensor sync_bn_grad_input(const Tensor& gy, const Tensor& x, const Tensor& total,
                            const Tensor& stats, const Tensor& weight) const override {
    return cuda::sync_bn::grad_input(gy, x, total, stats, weight);
  }

  void conv2d_forward(const conv_kernels::ConvShape& s, const Tensor& x, const Tensor& weight,
                      const Tensor& bias, Tensor& out) const override {
    cuda::conv2d_forward(s, x, weight, bias, out);
  }
  void conv2d_backward(const conv_kernels::ConvShape& s, const Tensor& x, const Tensor& weight,
                       const Tensor& gy, Tensor& grad_x, Tensor& grad_weight,
                       Tensor& grad_bias) const override {
    cuda::conv2d_backward(s, x, weight, gy, grad_x, grad_weight, grad_bias);
  }
  NormStats batch_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b,
                               const Tensor& running_mean, const Tensor& running_var,
                               bool training, double momentum, double eps,
                               Tensor& out) const override {
    return cuda::batch_norm_forward(x, w, b, running_mean, running_var, training, momentum, eps,
                                    out);
  }
  void batch_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& w,
                           const NormStats& stats, bool training, double eps, Tensor& grad_x,
                           Tensor& grad_weight, Tensor& grad_bias) const override {
    cuda::batch_norm_backward(grad, x, w, stats, training, eps, grad_x, grad_weight, grad_bias);
  }
  NormStats layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, int64_t rows,
                              int64_t d, double eps, Tensor& out) const override {
    return cuda::layer_norm_forward(x, w, b, rows, d, eps, out);
  }
  void layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& w,
                           const NormStats& stats, int64_t rows, int64_t d, Tensor& grad_x,
                           Tensor& grad_weight, Tensor& grad_bias) const override {
    cuda::layer_norm_backward(grad, x, w, stats, rows, d, grad_x, grad_weight, grad_bias);
  }
  LossForward cross_entropy_forward(const Tensor& x, const Tensor& t, double label_smoothing,
                                    Reduction reduction,
                                    std::optional<int64_t> ignore_index) const override {
    return cuda::cross_entropy_forward(x, t, label_smoothing, reduction, ignore_index);
  }
  Tensor cross_entropy_backward(const std::vector<Tensor>& saved, const Tensor& grad,
                                double label_smoothing, Reduction reduction,
                                std::optional<int64_t> ignore_index) const override {
    return cuda::cross_entropy_backward(saved, grad, label_smoothing, reduction, ignore_index);
  }
};

}  // namespace

const DeviceBackend* registered_cuda_backend() {
  static const CudaBackend backend;
  return &backend;
}

}  // namespace lockstep::runtime
