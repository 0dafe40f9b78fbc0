// conv2d on cuDNN: the graph API first (cudnn_graph_conv.h), the legacy API
// as the fallback (its descriptors and cached algorithm choice), the bias,
// and the autograd record.
#include "lockstep/runtime/cuda/ops/cudnn_conv.h"

#include <array>
#include <climits>
#include <map>
#include <mutex>
#include <optional>

#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/cuda/caching_allocator.h"
#include "lockstep/runtime/cuda/cudnn_check.h"
#include "lockstep/runtime/cuda/device_guard.h"
#include "lockstep/runtime/cuda/ops/cudnn_descriptors.h"
#include "lockstep/runtime/cuda/ops/cudnn_graph_conv.h"
#include "lockstep/runtime/cuda/ops/cudnn_handle.h"
#include "lockstep/runtime/cuda/ops/math_mode.h"
#include "lockstep/runtime/cuda/stream.h"
#include "lockstep/runtime/cuda/tensor_args.h"
#include "lockstep/runtime/ops/reduce.h"

namespace lockstep::runtime::cuda {
namespace {

using conv_kernels::ConvShape;

// Algorithms whose workspace exceeds this are passed over while another fits.
constexpr std::size_t kMaxWorkspace = std::size_t{1} << 30;

int to_int(int64_t v) {
  LOCKSTEP_CHECK(v >= 0 && v <= INT_MAX,
                 "conv2d on CUDA: size {} does not fit cuDNN's 32-bit sizes", v);
  return static_cast<int>(v);
}

const void* one(DType d) { return cudnn_one(d); }
const void* zero(DType d) { return cudnn_zero(d); }

// The math type asked of cuDNN: plain FMA for f32 unless TF32 is allowed
// (CUDNN_DEFAULT_MATH permits TF32 from Ampere on), tensor cores for 16-bit.
cudnnMathType_t requested_math(DType d, bool tf32) {
  if (d == DType::f32) return tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  if (d == DType::f64) return CUDNN_DEFAULT_MATH;
  return CUDNN_TENSOR_OP_MATH;
}

// Legacy descriptors of one call: input, output, weight, convolution.
struct Descriptors {
  cudnnDataType_t type;
  TensorDescriptor x, y;
  FilterDescriptor w;
  ConvolutionDescriptor conv;

  Descriptors(const ConvShape& s, DType dtype)
      : type(cudnn_data_type(dtype, "conv2d")),
        x(type, to_int(s.n), to_int(s.c_in), to_int(s.h), to_int(s.w)),
        y(type, to_int(s.n), to_int(s.c_out), to_int(s.oh), to_int(s.ow)),
        w(type, to_int(s.c_out), to_int(s.cin_g()), to_int(s.kh), to_int(s.kw)) {
    const cudnnDataType_t compute = dtype == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    LOCKSTEP_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        conv.get(), to_int(s.ph), to_int(s.pw), to_int(s.sh), to_int(s.sw), to_int(s.dh),
        to_int(s.dw), CUDNN_CROSS_CORRELATION, compute));
    LOCKSTEP_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv.get(), to_int(s.groups)));
  }
  void set_math(cudnnMathType_t math) const {
    LOCKSTEP_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.get(), math));
  }
};

// ---- legacy algorithm cache ------------------------------------------------

struct Choice {
  int algo = 0;  // a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  std::size_t workspace = 0;
};

struct Key {
  std::array<int64_t, 16> geometry{};
  int device = 0;
  DType dtype = DType::f32;
  bool tf32 = false;
  auto operator<=>(const Key&) const = default;
};

Key make_key(const ConvShape& s, DType dtype, int device, bool tf32) {
  return {{s.n, s.c_in, s.h, s.w, s.c_out, s.kh, s.kw, s.sh, s.sw, s.ph, s.pw, s.dh, s.dw,
           s.groups, s.oh, s.ow},
          device,
          dtype,
          tf32};
}

enum Direction { kForward, kBackwardData, kBackwardFilter };

struct Entry {
  std::optional<Choice> choice[3];
};

std::mutex& cache_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::map<Key, Entry>& cache() {
  static auto* c = new std::map<Key, Entry>;
  return *c;
}

// The first algorithm (cuDNN ranks them best first) that works with a
// workspace under kMaxWorkspace; else the working one that needs the least.
template <class Perf>
Choice pick(const Perf* perf, int count, bool force_fma, const char* what) {
  const Perf* best = nullptr;
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    if (perf[i].memory <= kMaxWorkspace) {
      best = &perf[i];
      break;
    }
    if (best == nullptr || perf[i].memory < best->memory) best = &perf[i];
  }
  LOCKSTEP_CHECK(best != nullptr, "conv2d on CUDA: cuDNN has no {} algorithm for this "
                 "convolution (dtype, groups and sizes as given)", what);
  // For f32 without TF32 keep the algorithm on FMA math whatever it reports.
  return {static_cast<int>(best->algo), force_fma ? CUDNN_FMA_MATH : best->mathType, 0};
}

Choice choose(Direction dir, cudnnHandle_t h, const Descriptors& d, DType dtype, bool tf32) {
  const cudnnMathType_t math = requested_math(dtype, tf32);
  const bool force_fma = math == CUDNN_FMA_MATH;
  d.set_math(math);
  Choice c;
  if (dir == kForward) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int n = 0;
    LOCKSTEP_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
        h, d.x.get(), d.w.get(), d.conv.get(), d.y.get(), CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n,
        perf));
    c = pick(perf, n, force_fma, "forward");
    d.set_math(c.math);
    LOCKSTEP_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(
        h, d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
        static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), &c.workspace));
  } else if (dir == kBackwardData) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int n = 0;
    LOCKSTEP_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        h, d.w.get(), d.y.get(), d.conv.get(), d.x.get(), CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
        &n, perf));
    c = pick(perf, n, force_fma, "backward-data");
    d.set_math(c.math);
    LOCKSTEP_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
        h, d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
        static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo), &c.workspace));
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int n = 0;
    LOCKSTEP_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        h, d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf));
    c = pick(perf, n, force_fma, "backward-filter");
    d.set_math(c.math);
    LOCKSTEP_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
        h, d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
        static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), &c.workspace));
  }
  return c;
}

// The cached choice for `dir`, chosen on first use; leaves the descriptor's
// math type set to the choice's.
Choice algorithm(Direction dir, cudnnHandle_t h, const Descriptors& d, const ConvShape& s,
                 DType dtype, int device) {
  const bool tf32 = allow_tf32();
  const Key key = make_key(s, dtype, device, tf32);
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    const auto it = cache().find(key);
    if (it != cache().end() && it->second.choice[dir]) {
      const Choice c = *it->second.choice[dir];
      d.set_math(c.math);
      return c;
    }
  }
  // Chosen outside the lock: two threads may both choose; they agree.
  const Choice c = choose(dir, h, d, dtype, tf32);
  std::lock_guard<std::mutex> lock(cache_mutex());
  cache()[key].choice[dir] = c;
  return c;
}

// Scratch memory for one cuDNN call, on the current stream (freed when the
// call's work is queued: later work on that stream reuses it in order).
DeviceBuffer workspace(std::size_t bytes, int device) {
  return bytes == 0 ? DeviceBuffer() : DeviceBuffer(bytes, current_stream(device));
}

// Legacy descriptors of the bias [c_out] and the output it broadcasts over.
struct BiasDescriptors {
  TensorDescriptor b, y;
  BiasDescriptors(const ConvShape& s, cudnnDataType_t type)
      : b(type, 1, to_int(s.c_out), 1, 1),
        y(type, to_int(s.n), to_int(s.c_out), to_int(s.oh), to_int(s.ow)) {}
};

// y += bias over every image and pixel.
void add_bias(cudnnHandle_t h, const ConvShape& s, const Tensor& b, Tensor& y) {
  const DType dt = y.dtype();
  if (dt == DType::bf16) {
    // cuDNN's legacy tensor ops do not promise bf16: our broadcast add (f32 math).
    NoGradGuard no_grad;
    y.add_(b.view({1, s.c_out, 1, 1}));
    return;
  }
  const BiasDescriptors d(s, cudnn_data_type(dt, "conv2d"));
  LOCKSTEP_CUDNN_CHECK(
      cudnnAddTensor(h, one(dt), d.b.get(), b.raw_data(), one(dt), d.y.get(), y.raw_data()));
}

// gb = gy summed over every image and pixel.
void bias_grad(cudnnHandle_t h, const ConvShape& s, const Tensor& gy, Tensor& gb) {
  const DType dt = gy.dtype();
  if (dt == DType::bf16) {
    gb = sum(gy, {0, 2, 3});  // as for the bias add above
    return;
  }
  const BiasDescriptors d(s, cudnn_data_type(dt, "conv2d"));
  LOCKSTEP_CUDNN_CHECK(cudnnConvolutionBackwardBias(h, one(dt), d.y.get(), gy.raw_data(),
                                                    zero(dt), d.b.get(), gb.raw_data()));
}

void forward(const ConvShape& s, const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) {
  const int device = x.device().index;
  const DType dt = x.dtype();
  cudnnHandle_t h = cudnn_handle(device);
  if (!graph_conv(h, ConvDirection::forward, s, dt, device,
                  {x.raw_data(), w.raw_data(), y.raw_data()})) {
    const Descriptors d(s, dt);
    const Choice c = algorithm(kForward, h, d, s, dt, device);
    DeviceBuffer ws = workspace(c.workspace, device);
    LOCKSTEP_CUDNN_CHECK(cudnnConvolutionForward(
        h, one(dt), d.x.get(), x.raw_data(), d.w.get(), w.raw_data(), d.conv.get(),
        static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), ws.data(), c.workspace, zero(dt),
        d.y.get(), y.raw_data()));
  }
  if (b.defined()) add_bias(h, s, b, y);
}

// Any of gx, gw, gb may be undefined (not wanted); the others are overwritten.
void backward(const ConvShape& s, const Tensor& x, const Tensor& w, const Tensor& gy, Tensor& gx,
              Tensor& gw, Tensor& gb) {
  const int device = x.device().index;
  const DType dt = x.dtype();
  cudnnHandle_t h = cudnn_handle(device);
  std::optional<Descriptors> legacy;  // made when a direction falls back
  auto descriptors = [&]() -> const Descriptors& {
    if (!legacy) legacy.emplace(s, dt);
    return *legacy;
  };
  if (gx.defined() && !graph_conv(h, ConvDirection::backward_data, s, dt, device,
                                  {gx.raw_data(), w.raw_data(), gy.raw_data()})) {
    const Descriptors& d = descriptors();
    const Choice c = algorithm(kBackwardData, h, d, s, dt, device);
    DeviceBuffer ws = workspace(c.workspace, device);
    LOCKSTEP_CUDNN_CHECK(cudnnConvolutionBackwardData(
        h, one(dt), d.w.get(), w.raw_data(), d.y.get(), gy.raw_data(), d.conv.get(),
        static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo), ws.data(), c.workspace, zero(dt),
        d.x.get(), gx.raw_data()));
  }
  if (gw.defined() && !graph_conv(h, ConvDirection::backward_filter, s, dt, device,
                                  {x.raw_data(), gw.raw_data(), gy.raw_data()})) {
    const Descriptors& d = descriptors();
    const Choice c = algorithm(kBackwardFilter, h, d, s, dt, device);
    DeviceBuffer ws = workspace(c.workspace, device);
    LOCKSTEP_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
        h, one(dt), d.x.get(), x.raw_data(), d.y.get(), gy.raw_data(), d.conv.get(),
        static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), ws.data(), c.workspace, zero(dt),
        d.w.get(), gw.raw_data()));
  }
  if (gb.defined()) bias_grad(h, s, gy, gb);
}

// No output, or no input value reaching it (no input channels, an empty
// kernel or an empty image that padding alone covers): nothing for cuDNN to do
// (it rejects zero-sized descriptors). The output is then the bias alone, the
// input and weight gradients are zeros, the bias gradient the sum of gy.
bool degenerate(const ConvShape& s) {
  return s.n == 0 || s.c_out == 0 || s.cin_g() == 0 || s.kh == 0 || s.kw == 0 || s.h == 0 ||
         s.w == 0;
}

}  // namespace

void conv2d_forward(const ConvShape& s, const Tensor& x, const Tensor& weight,
                    const Tensor& bias, Tensor& out) {
  check_device("conv2d", x.device(), {&x, &weight, &bias, &out});
  (void)cudnn_data_type(x.dtype(), "conv2d");
  DeviceGuard guard(x.device().index);
  if (!degenerate(s)) {
    forward(s, x, weight, bias, out);
  } else if (out.numel() > 0) {
    NoGradGuard no_grad;
    out.zero_();
    if (bias.defined()) out.add_(bias.detach().view({1, s.c_out, 1, 1}));
  }
}

void conv2d_backward(const ConvShape& s, const Tensor& x, const Tensor& weight, const Tensor& gy,
                     Tensor& grad_x, Tensor& grad_weight, Tensor& grad_bias) {
  DeviceGuard guard(x.device().index);
  if (!degenerate(s)) {
    backward(s, x, weight, gy, grad_x, grad_weight, grad_bias);
    return;
  }
  NoGradGuard no_grad;
  if (grad_x.defined()) grad_x.zero_();
  if (grad_weight.defined()) grad_weight.zero_();
  if (grad_bias.defined()) {
    if (gy.numel() > 0) grad_bias.copy_(runtime::sum(gy, {0, 2, 3}));
    else grad_bias.zero_();
  }
}

}  // namespace lockstep::runtime::cuda
