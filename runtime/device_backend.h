// What a device other than the CPU gives lockstep: memory, in-place tensor
// writes, and the kernels runtime/ops reaches through device_backend(). An op
// checks its arguments, records its autograd node, and calls the CPU loop or
// device_backend(x.device()).<kernel>; it never names CUDA. The CUDA backend
// implements this class in runtime/cuda/cuda_backend.cpp, its one
// registration point; a build without CUDA gets this base class, whose every
// kernel throws "lockstep was built without CUDA", naming the op.
//
// Kernels take tensors on the backend's device with their shapes and dtypes
// already checked by the op, and queue work on the device's current stream.
// Each op's forward and backward are separate kernels here; the op records
// the autograd node between them, once for every device.
//
// Autocast (runtime/autocast.h) chooses each op's compute dtype at the same
// point, before the kernel call: the op casts its arguments by its policy
// row (lower, f32, or the widest input) and calls itself again, so kernels
// only ever see arguments of one dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/runtime/cuda_available.h"
#include "lockstep/runtime/ops/elementwise_codes.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

class Generator;
enum class Reduction;
struct SgdTensor;
struct AdamTensor;
template <class Entry>
struct FusedParam;
namespace sync_bn {
struct Combined;
struct GradSums;
}
namespace conv_kernels {
struct ConvShape;
}
namespace pool_kernels {
struct PoolShape;
}

// Timing marks on one device (DDP's device timeline): each recorded where
// the device is when asked, read back once complete. Marks are numbered by
// the caller and made on first use.
class DeviceMarks {
 public:
  virtual ~DeviceMarks() = default;
  // Records `mark` on the device's current stream.
  virtual void record(size_t mark) = 0;
  // Makes a side stream current (one that waits for nothing else), runs
  // `queue_waits` (e.g. a collective's wait(), which makes the current stream
  // wait for it), and records `mark` there: the compute stream is not held back.
  virtual void record_after_on_side(size_t mark, const std::function<void()>& queue_waits) = 0;
  // Blocks the host until `mark`'s work is done.
  virtual void synchronize(size_t mark) = 0;
  // Milliseconds from `from` to `to`, both recorded and complete.
  virtual double elapsed_ms(size_t from, size_t to) = 0;
};

// One kernel, copy or fill that ran on a device, as the device's own
// profiler saw it (CUPTI's activity records on CUDA): its name (demangled)
// and when it started and ended, in microseconds on the device's clock.
struct DeviceActivity {
  std::string name;
  double start_us = 0;
  double end_us = 0;
};

// Records every kernel, copy and fill the devices run from start until
// stop(), whichever thread queued them (a benchmark's "where the time goes").
class DeviceActivityTrace {
 public:
  virtual ~DeviceActivityTrace() = default;
  // Waits for the devices, ends the trace and returns what ran, by start time.
  virtual std::vector<DeviceActivity> stop() = 0;
};

// A loss's forward on a device: its value, and what its backward reads.
struct LossForward {
  Tensor out;
  std::vector<Tensor> saved;
};

// What a normalisation's forward saves for its backward: per row (layer_norm)
// or per channel (batch_norm), mean and 1 / sqrt(var + eps), in the dtype the
// backend keeps them in.
struct NormStats {
  Tensor mean;
  Tensor invstd;
};

struct ValuesAndIndices {
  Tensor values;  // undefined when not asked for
  Tensor indices;
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  // Devices and memory. make_current: `device` is the calling thread's
  // current device until the returned guard is destroyed.
  virtual GpuInventory probe() const;
  virtual void set_current(int index) const;
  virtual std::shared_ptr<void> make_current(Device device) const;
  virtual std::unique_ptr<DeviceMarks> timing_marks(Device device) const;
  // Starts recording the device activity of the whole process. One trace
  // at a time; throws where the profiler cannot be loaded, saying why.
  virtual std::unique_ptr<DeviceActivityTrace> trace_activity() const;
  // Blocks the host until everything queued on `device` is done.
  virtual void synchronize(Device device) const;
  // The device's product name, e.g. "NVIDIA H100 80GB HBM3".
  virtual std::string name(Device device) const;
  // Which physical device `device` is, the same in every process whatever
  // its CUDA_VISIBLE_DEVICES: on CUDA its UUID as nvidia-smi writes it
  // ("GPU-8a1b2c3d-..."), else its PCI bus id. Empty where it cannot be told
  // (no such device here, or a build without CUDA); never throws.
  virtual std::string physical_id(Device device) const;
  // Whether f32 matrix products may use TF32 tensor cores (off by default).
  virtual void set_allow_tf32(bool allow) const;
  // cuDNN benchmark mode: each convolution's first run at a new shape times
  // cuDNN's engines and keeps the fastest (off by default).
  virtual void set_cudnn_benchmark(bool on) const;
  virtual void* allocate(size_t nbytes, Device device) const;
  virtual void free(void* data, Device device) const;
  // The most memory the allocator had handed out on `device` at once since
  // the last reset_peak_memory (which sets it to what is in use now).
  virtual size_t peak_allocated_bytes(Device device) const;
  virtual void reset_peak_memory(Device device) const;

  // In-place writes of `dst` (Tensor::copy_, fill_, add_, mul_; scale_into
  // is dst = factor * src in one kernel).
  virtual void copy(const Tensor& dst, const Tensor& src) const;
  virtual void fill(const Tensor& dst, double value) const;
  virtual void add_into(const Tensor& dst, const Tensor& other, double alpha) const;
  virtual void mul_into(const Tensor& dst, const Tensor& other) const;
  virtual void mul_scalar_into(const Tensor& dst, double factor) const;
  virtual void scale_into(const Tensor& dst, const Tensor& src, double factor) const;

  // Elementwise, broadcasting; the result in `dtype` (bool for comparisons).
  virtual Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b, DType dtype, double alpha,
                        const char* name) const;
  virtual Tensor unary(UnaryOp op, const Tensor& a, double scalar, const char* name) const;

  // Reductions: sum over `dims` (kept as size 1) times `scale`; the maximum
  // along `dim` with its index; max's backward scatters `grad` to `indices`.
  virtual Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, double scale,
                     DType out_dtype) const;
  virtual ValuesAndIndices max_along(const Tensor& a, int64_t dim, bool want_values) const;
  virtual Tensor max_backward(const Tensor& grad, const Tensor& indices, const Shape& in_shape,
                              int64_t dim, DType dtype) const;

  // c = alpha * a @ b + beta * c (2-D); out[i] = a[i] @ b[i] (3-D); the sum
  // of a 2-D tensor's rows.
  virtual void gemm(const Tensor& a, const Tensor& b, Tensor& c, double alpha,
                    double beta) const;
  virtual void gemm_batched(const Tensor& a, const Tensor& b, Tensor& out) const;
  virtual Tensor sum_rows(const Tensor& x) const;

  virtual Tensor softmax_forward(const Tensor& x, int64_t dim, bool log) const;
  virtual Tensor softmax_backward(const Tensor& y, const Tensor& grad, int64_t dim,
                                  bool log) const;

  virtual void dropout_forward(const Tensor& x, const Tensor& y, const Tensor& mask,
                               uint64_t threshold, double scale, Generator& g) const;
  virtual void dropout_backward(const Tensor& grad_y, const Tensor& mask, double scale,
                                const Tensor& grad_x) const;
  virtual void embedding_forward(const Tensor& indices, const Tensor& weight,
                                 const Tensor& out) const;
  // Row padding_idx (in [0, rows), or -1 for none) gets no gradient.
  virtual Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t rows,
                                    int64_t dim, int64_t padding_idx) const;

  virtual void max_pool2d_forward(const pool_kernels::PoolShape& s, const Tensor& x,
                                  const Tensor& y, const Tensor& argmax) const;
  virtual void max_pool2d_backward(const pool_kernels::PoolShape& s, const Tensor& grad_y,
                                   const Tensor& argmax, const Tensor& grad_x) const;
  virtual void avg_pool2d_forward(const pool_kernels::PoolShape& s, bool adaptive,
                                  const Tensor& x, const Tensor& y) const;
  virtual void avg_pool2d_backward(const pool_kernels::PoolShape& s, bool adaptive,
                                   const Tensor& grad_y, const Tensor& grad_x) const;

  // One optimizer step for every parameter given (all on this backend's
  // devices; ops/fused_step.h): one launch per device.
  virtual void fused_sgd_step(const std::vector<FusedParam<SgdTensor>>& params) const;
  virtual void fused_adam_step(const std::vector<FusedParam<AdamTensor>>& params) const;

  // Loss scaling (ops/amp.h): each gradient *= inv_scale in place, found_inf
  // set to 1 where one held inf or NaN; the scale's growth or backoff. The
  // 1-element tensors stay on the device: no host sync.
  virtual void amp_unscale(const std::vector<Tensor>& grads, const Tensor& found_inf,
                           const Tensor& inv_scale) const;
  virtual void amp_update_scale(const Tensor& scale, const Tensor& growth_tracker,
                                const Tensor& found_inf, double growth_factor,
                                double backoff_factor, int64_t growth_interval) const;

  // SyncBatchNorm's passes around its collectives (ops/sync_batch_norm.h).
  virtual Tensor sync_bn_local_stats(const Tensor& x) const;
  virtual sync_bn::Combined sync_bn_combine(const Tensor& gathered, int world, DType dtype,
                                            const Tensor& weight, const Tensor& bias,
                                            const Tensor& running_mean,
                                            const Tensor& running_var, double momentum,
                                            double eps) const;
  virtual Tensor sync_bn_affine(const Tensor& x, const Tensor& scale, const Tensor& shift) const;
  virtual sync_bn::GradSums sync_bn_grad_sums(const Tensor& gy, const Tensor& x,
                                              const Tensor& stats, bool need_weight,
                                              bool need_bias) const;
  virtual Tensor sync_bn_grad_input(const Tensor& gy, const Tensor& x, const Tensor& total,
                                    const Tensor& stats, const Tensor& weight) const;

  // out = conv2d(x, weight) + bias; the backward writes each gradient that is
  // defined. All contiguous; `s` is their checked geometry.
  virtual void conv2d_forward(const conv_kernels::ConvShape& s, const Tensor& x,
                              const Tensor& weight, const Tensor& bias, Tensor& out) const;
  virtual void conv2d_backward(const conv_kernels::ConvShape& s, const Tensor& x,
                               const Tensor& weight, const Tensor& gy, Tensor& grad_x,
                               Tensor& grad_weight, Tensor& grad_bias) const;

  // x: contiguous logits [N, C], t: contiguous i64 targets [N], checked. The
  // backward gets what the forward saved. A row whose target is
  // ignore_index has loss 0 and a zero gradient row (given with
  // Reduction::None only: the op reduces the rows kept).
  virtual LossForward cross_entropy_forward(const Tensor& x, const Tensor& t,
                                            double label_smoothing, Reduction reduction,
                                            std::optional<int64_t> ignore_index) const;
  virtual Tensor cross_entropy_backward(const std::vector<Tensor>& saved, const Tensor& grad,
                                        double label_smoothing, Reduction reduction,
                                        std::optional<int64_t> ignore_index) const;

  // out = layer_norm over the last `d` values of each of `rows` rows of x;
  // w and b optional, all contiguous. The backward writes each gradient that
  // is defined.
  virtual NormStats layer_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b,
                                      int64_t rows, int64_t d, double eps, Tensor& out) const;
  virtual void layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& w,
                                   const NormStats& stats, int64_t rows, int64_t d,
                                   Tensor& grad_x, Tensor& grad_weight, Tensor& grad_bias) const;

  // out = batch_norm(x) over x viewed as [n, c, inner], with the batch's
  // statistics when training (then running_mean/var, when defined, are
  // updated in place) or else the running ones; w and b optional, x and out
  // contiguous. The backward writes each gradient that is defined.
  virtual NormStats batch_norm_forward(const Tensor& x, const Tensor& w, const Tensor& b,
                                       const Tensor& running_mean, const Tensor& running_var,
                                       bool training, double momentum, double eps,
                                       Tensor& out) const;
  virtual void batch_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& w,
                                   const NormStats& stats, bool training, double eps,
                                   Tensor& grad_x, Tensor& grad_weight, Tensor& grad_bias) const;

 protected:
  // The error every kernel of the base class throws.
  [[noreturn]] void missing(std::string_view what) const;
};

// While alive, `device` is the calling thread's current device (nothing for
// the CPU).
class CurrentDevice {
 public:
  explicit CurrentDevice(Device device);

 private:
  std::shared_ptr<void> guard_;
};

// The backend of `device` (not the CPU). Throws, naming `device`, for a kind
// this build has no backend for.
const DeviceBackend& device_backend(Device device);

// The CUDA backend: runtime/cuda/cuda_backend.cpp in a CUDA build, else null
// (runtime/no_cuda/cuda_backend.cpp). CMake builds exactly one of the two.
const DeviceBackend* registered_cuda_backend();

}  // namespace lockstep::runtime
