// Activations and (log-)softmax with their gradients. Autograd is recorded
// once per op, for every device; tensors off the CPU run their device
// backend's elementwise and softmax kernels (device_backend.h).
#include "lockstep/runtime/ops/activation.h"

#include <cmath>
#include <type_traits>

#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/cpu/vec_math.h"
#include "lockstep/runtime/device_backend.h"
#include "lockstep/runtime/ops/activation_kernels.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/detail/float_map.h"
#include "lockstep/runtime/ops/reduce.h"
#include "lockstep/runtime/ops/detail/reduced_float.h"

namespace lockstep::runtime {

namespace {

// f(x) elementwise: the device kernel `op` off the CPU.
template <class F>
Tensor map_act(const Tensor& x, const char* name, UnaryOp op, F f) {
  if (!x.device().is_cpu()) return device_backend(x.device()).unary(op, x, 0.0, name);
  return detail::map_float(x, name, f);
}

// f(grad, saved) elementwise in saved's dtype: the device kernel `op` off the
// CPU.
template <class F>
Tensor zip_act(const Tensor& grad, const Tensor& saved, const char* name, BinaryOp op, F f) {
  if (!saved.device().is_cpu())
    return device_backend(saved.device()).binary(op, grad, saved, saved.dtype(), 1.0, name);
  return detail::zip_float(grad, saved, name, f);
}

// Runs f(rows, n, in, out) on `x` moved so that `dim` is last and contiguous,
// and moves the result back.
template <class F>
Tensor along_last(const Tensor& x, int64_t dim, F f) {
  dim = wrap_dim(dim, x.dim());
  const bool last = dim == x.dim() - 1 || x.dim() == 0;
  Tensor moved = (last ? x : x.transpose(dim, -1)).contiguous();
  Tensor out = Tensor::empty(moved.shape(), x.dtype());
  const int64_t n = x.dim() == 0 ? 1 : moved.shape().back();
  const int64_t rows = n == 0 ? 0 : moved.numel() / n;
  f(moved, out, rows, n);
  return last ? out : out.transpose(dim, -1).contiguous();
}

}  // namespace

Tensor relu(const Tensor& x) {
  // NaN passes through forward and backward, as PyTorch's clamp and threshold_backward.
  Tensor out = map_act(x, "relu", UnaryOp::relu,
                       [](auto v) { return (v > 0 || v != v) ? v : decltype(v)(0); });
  return record(out, "ReluBackward", {x}, {out}, [](const BackwardArgs& g) {
    return std::vector<Tensor>{zip_act(g.grad, g.saved[0], "relu backward",
                                       BinaryOp::relu_backward, [](auto gy, auto y) {
                                         return y <= 0 ? decltype(gy)(0) : gy;
                                       })};
  });
}

namespace {

// GELU on the CPU: the vector kernels for f32, bf16 and f16, libm for f64.
Tensor gelu_cpu(const Tensor& x) {
  Tensor c = x.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  dispatch_floating(x.dtype(), "gelu", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = c.data_ptr<T>();
    T* yp = out.data_ptr<T>();
    const int64_t n = c.numel();
    if constexpr (std::is_same_v<T, double>) {
      for (int64_t i = 0; i < n; ++i) yp[i] = 0.5 * xp[i] * (1 + std::erf(xp[i] * M_SQRT1_2));
    } else {
      activation_kernels::gelu_forward(xp, yp, n);
    }
  });
  return out;
}

Tensor gelu_backward_cpu(const Tensor& grad, const Tensor& x) {
  Tensor gy = grad.contiguous().to(x.dtype()), c = x.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  dispatch_floating(x.dtype(), "gelu backward", [&](auto tag) {
    using T = decltype(tag);
    const T* gp = gy.data_ptr<T>();
    const T* xp = c.data_ptr<T>();
    T* op = out.data_ptr<T>();
    const int64_t n = c.numel();
    if constexpr (std::is_same_v<T, double>) {
      for (int64_t i = 0; i < n; ++i) {
        const double v = xp[i], cdf = 0.5 * (1 + std::erf(v * M_SQRT1_2));
        op[i] = gp[i] * (cdf + v * std::exp(-0.5 * v * v) * 0.3989422804014327);
      }
    } else {
      activation_kernels::gelu_backward(gp, xp, op, n);
    }
  });
  return out;
}

}  // namespace

Tensor gelu(const Tensor& x) {
  Tensor out = x.device().is_cpu()
                   ? gelu_cpu(x)
                   : device_backend(x.device()).unary(UnaryOp::gelu, x, 0.0, "gelu");
  return record(out, "GeluBackward", {x}, {x}, [](const BackwardArgs& g) {
    const Tensor& x = g.saved[0];
    if (x.device().is_cpu()) return std::vector<Tensor>{gelu_backward_cpu(g.grad, x)};
    return std::vector<Tensor>{device_backend(x.device())
                                   .binary(BinaryOp::gelu_backward, g.grad, x, x.dtype(), 1.0,
                                           "gelu backward")};
  });
}

Tensor sigmoid(const Tensor& x) {
  Tensor out = map_act(x, "sigmoid", UnaryOp::sigmoid, [](auto v) {
    using T = decltype(v);
    // Split by sign so that exp never overflows.
    if (v >= 0) return T(1) / (T(1) + std::exp(-v));
    T e = std::exp(v);
    return e / (T(1) + e);
  });
  return record(out, "SigmoidBackward", {x}, {out}, [](const BackwardArgs& g) {
    return std::vector<Tensor>{zip_act(g.grad, g.saved[0], "sigmoid backward",
                                       BinaryOp::sigmoid_backward,
                                       [](auto gy, auto y) { return gy * y * (1 - y); })};
  });
}

Tensor tanh(const Tensor& x) {
  Tensor out = map_act(x, "tanh", UnaryOp::tanh, [](auto v) { return std::tanh(v); });
  return record(out, "TanhBackward", {x}, {out}, [](const BackwardArgs& g) {
    return std::vector<Tensor>{zip_act(g.grad, g.saved[0], "tanh backward",
                                       BinaryOp::tanh_backward,
                                       [](auto gy, auto y) { return gy * (1 - y * y); })};
  });
}

namespace {

Tensor softmax_cpu(const Tensor& x, int64_t dim) {
  return along_last(x, dim, [&](const Tensor& in, Tensor& o, int64_t rows, int64_t n) {
    dispatch_float(x.dtype(), "softmax", [&](auto tag) {
      using T = decltype(tag);
      const T* ip = in.data_ptr<T>();
      T* op = o.data_ptr<T>();
      for (int64_t r = 0; r < rows; ++r) {
        const T* row = ip + r * n;
        T* orow = op + r * n;
        const T mx = cpu::row_max(row, n);
        const T s = cpu::exp_shifted(row, orow, n, mx);
        for (int64_t i = 0; i < n; ++i) orow[i] /= s;
      }
    });
  });
}

Tensor log_softmax_cpu(const Tensor& x, int64_t dim) {
  return along_last(x, dim, [&](const Tensor& in, Tensor& o, int64_t rows, int64_t n) {
    dispatch_float(x.dtype(), "log_softmax", [&](auto tag) {
      using T = decltype(tag);
      const T* ip = in.data_ptr<T>();
      T* op = o.data_ptr<T>();
      for (int64_t r = 0; r < rows; ++r) {
        const T* row = ip + r * n;
        T* orow = op + r * n;
        const T mx = cpu::row_max(row, n);
        const T log_sum = std::log(cpu::exp_shifted(row, static_cast<T*>(nullptr), n, mx));
        // (x - max) - log(sum), in PyTorch's order: max + log(sum) would round
        // log(sum) away once |max| is large (all of it from 1e8 in f32).
        for (int64_t i = 0; i < n; ++i) orow[i] = (row[i] - mx) - log_sum;
      }
    });
  });
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  if (auto c = detail::autocast_inputs(detail::CastPolicy::f32, {x})) return softmax((*c)[0], dim);
  if (auto low = detail::cpu_reduced_dtype({x}))
    return detail::in_f32(*low, {x}, [&](const auto& in) { return softmax(in[0], dim); });
  Tensor out = !x.device().is_cpu() ? device_backend(x.device()).softmax_forward(x, dim, false)
                                    : softmax_cpu(x, dim);
  return record(out, "SoftmaxBackward", {x}, {out}, [dim](const BackwardArgs& g) {
    const Tensor& y = g.saved[0];
    if (!y.device().is_cpu())
      return std::vector<Tensor>{device_backend(y.device()).softmax_backward(y, g.grad, dim, false)};
    // dx = y * (dy - sum(dy * y))
    Tensor gy = g.grad.to(y.dtype());
    Tensor dot = sum(mul(gy, y), {dim}, true);
    return std::vector<Tensor>{mul(y, sub(gy, dot))};
  });
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  if (auto c = detail::autocast_inputs(detail::CastPolicy::f32, {x}))
    return log_softmax((*c)[0], dim);
  if (auto low = detail::cpu_reduced_dtype({x}))
    return detail::in_f32(*low, {x}, [&](const auto& in) { return log_softmax(in[0], dim); });
  Tensor out = !x.device().is_cpu() ? device_backend(x.device()).softmax_forward(x, dim, true)
                                    : log_softmax_cpu(x, dim);
  return record(out, "LogSoftmaxBackward", {x}, {out}, [dim](const BackwardArgs& g) {
    const Tensor& y = g.saved[0];
    if (!y.device().is_cpu())
      return std::vector<Tensor>{device_backend(y.device()).softmax_backward(y, g.grad, dim, true)};
    // dx = dy - softmax * sum(dy)
    Tensor gy = g.grad.to(y.dtype());
    return std::vector<Tensor>{sub(gy, mul(exp(y), sum(gy, {dim}, true)))};
  });
}

}  // namespace lockstep::runtime
