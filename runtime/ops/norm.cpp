// batch_norm and layer_norm: argument checks and the autograd wiring for
// every device; the loops are in norm_kernels.cpp on the CPU and the device
// backend's kernels elsewhere.
#include "lockstep/runtime/ops/norm.h"

#include <cmath>
#include <memory>

#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/autograd/affine_inputs.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/device_backend.h"
#include "lockstep/runtime/ops/norm_kernels.h"
#include "lockstep/runtime/ops/detail/reduced_float.h"
#include "lockstep/runtime/ops/running_stats.h"

namespace lockstep::runtime {
namespace {

using norm_kernels::ChannelShape;

void check_param(const char* op, const char* name, const Tensor& p, const Shape& expected,
                 const Tensor& x) {
  if (!p.defined()) return;
  LOCKSTEP_CHECK(p.shape() == expected, "{}: expected {} of shape {} for input {}, got {}", op,
                 name, shape_str(expected), shape_str(x.shape()), shape_str(p.shape()));
  LOCKSTEP_CHECK(p.dtype() == x.dtype(), "{}: input is {} but {} is {}; convert with .to()", op,
                 dtype_name(x.dtype()), name, dtype_name(p.dtype()));
  LOCKSTEP_CHECK(p.device() == x.device(), "{}: input is on {} but {} is on {}; move it with "
                 ".to(device)", op, x.device().str(), name, p.device().str());
}

// A small parameter or buffer read as doubles (detached: nothing to record).
std::vector<double> values(const Tensor& t) { return t.detach().to_vector<double>(); }

// The CPU's batch_norm kernels: statistics (f64 [c] tensors) and running
// updates in double, the passes in norm_kernels.
NormStats cpu_batch_norm_forward(const ChannelShape& s, const Tensor& x, const Tensor& weight,
                                 const Tensor& bias, const Tensor& running_mean,
                                 const Tensor& running_var, bool training, double momentum,
                                 double eps, Tensor& out) {
  const int64_t c = s.c;
  std::vector<double> mean(c), invstd(c);
  if (training) {
    std::vector<double> var(c);
    dispatch_float(x.dtype(), "batch_norm", [&](auto tag) {
      using T = decltype(tag);
      norm_kernels::channel_stats<T>(s, x.data_ptr<T>(), mean.data(), var.data());
    });
    for (int64_t i = 0; i < c; ++i) invstd[i] = 1.0 / std::sqrt(var[i] + eps);
    if (running_mean.defined())
      update_running_stats(running_mean, running_var, mean.data(), var.data(), s.count(),
                           momentum);
  } else {
    mean = values(running_mean);
    const std::vector<double> rv = values(running_var);
    for (int64_t i = 0; i < c; ++i) invstd[i] = 1.0 / std::sqrt(rv[i] + eps);
  }

  // y = x * scale + shift with scale = w * invstd, shift = b - mean * scale.
  const std::vector<double> w = weight.defined() ? values(weight) : std::vector<double>(c, 1.0);
  const std::vector<double> b = bias.defined() ? values(bias) : std::vector<double>(c, 0.0);
  dispatch_float(x.dtype(), "batch_norm", [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> scale(c), shift(c);
    for (int64_t i = 0; i < c; ++i) {
      scale[i] = static_cast<T>(w[i] * invstd[i]);
      shift[i] = norm_kernels::affine_shift<T>(b[i], mean[i], scale[i]);
    }
    norm_kernels::channel_affine<T>(s, x.data_ptr<T>(), scale.data(), shift.data(),
                                    out.data_ptr<T>());
  });
  return {Tensor::from_vector(mean, {c}), Tensor::from_vector(invstd, {c})};
}

void cpu_batch_norm_backward(const ChannelShape& s, const Tensor& gy, const Tensor& x,
                             const Tensor& weight, const NormStats& stats, bool training,
                             Tensor& grad_x, Tensor& grad_w, Tensor& grad_b) {
  const int64_t c = s.c;
  const double* mean = stats.mean.data_ptr<double>();
  const double* invstd = stats.invstd.data_ptr<double>();
  const std::vector<double> w = weight.defined() ? values(weight) : std::vector<double>(c, 1.0);
  dispatch_float(gy.dtype(), "batch_norm backward", [&](auto tag) {
    using T = decltype(tag);
    const T* g = gy.data_ptr<T>();
    const T* xp = x.data_ptr<T>();
    std::vector<double> sum_gy(c), sum_gy_xc(c);
    if (grad_w.defined() || grad_b.defined() || (training && grad_x.defined()))
      norm_kernels::channel_grad_sums<T>(s, g, xp, mean, sum_gy.data(), sum_gy_xc.data());
    if (grad_x.defined()) {
      // Training: gx = w*invstd * (gy - mean(gy) - xhat * mean(gy * xhat)),
      // folded into gx = gy * ka + x * kb + kc. Eval: gx = gy * w * invstd.
      const double m = static_cast<double>(s.count());
      std::vector<T> ka(c), kb(c), kc(c);
      for (int64_t i = 0; i < c; ++i) {
        const double is = invstd[i], k1 = w[i] * is;
        double b = 0, k = 0;
        if (training) {
          b = -k1 * is * is * sum_gy_xc[i] / m;
          k = -k1 * sum_gy[i] / m - b * mean[i];
        }
        ka[i] = static_cast<T>(k1), kb[i] = static_cast<T>(b), kc[i] = static_cast<T>(k);
      }
      if (training) {
        norm_kernels::channel_grad_input<T>(s, g, xp, ka.data(), kb.data(), kc.data(),
                                            grad_x.data_ptr<T>());
      } else {
        norm_kernels::channel_affine<T>(s, g, ka.data(), kc.data(), grad_x.data_ptr<T>());
      }
    }
    for (int64_t i = 0; i < c; ++i) {
      if (grad_w.defined()) grad_w.data_ptr<T>()[i] = static_cast<T>(sum_gy_xc[i] * invstd[i]);
      if (grad_b.defined()) grad_b.data_ptr<T>()[i] = static_cast<T>(sum_gy[i]);
    }
  });
}

// Normalising no values at all (the empty batch of a rank that has joined,
// nn::Join, or an input with no channels): an empty output, no statistics, running statistics untouched,
// and zero weight and bias gradients (sums over no samples). The same on
// every device, and no kernel is launched on zero elements.
Tensor empty_batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const AffineInputs graph = affine_inputs(x, x, weight, weight, bias);
  const int w_at = graph.w_at, b_at = graph.b_at;
  const Shape x_shape = x.shape(), c_shape{x.size(1)};
  const DType dtype = x.dtype();
  const Device device = x.device();
  return record(Tensor::empty(x_shape, dtype, device), "BatchNormBackward", graph.inputs, {},
                [=](const BackwardArgs& a) {
                  std::vector<Tensor> grads(a.needs.size());
                  if (a.needs[0]) grads[0] = Tensor::empty(x_shape, dtype, device);
                  for (int at : {w_at, b_at}) {
                    if (at >= 0 && a.needs[at]) grads[at] = Tensor::zeros(c_shape, dtype, device);
                  }
                  return grads;
                });
}

}  // namespace

Tensor batch_norm(const Tensor& x_in, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum, double eps) {
  // Running statistics pass as they are: they are updated in place.
  if (auto c = detail::autocast_inputs(detail::CastPolicy::f32, {x_in, weight, bias}))
    return batch_norm((*c)[0], (*c)[1], (*c)[2], running_mean, running_var, training, momentum,
                      eps);
  // Widened when the input is 16-bit, whose dtype the output keeps; a 16-bit
  // weight or bias beside a wider input is a dtype mismatch, refused below.
  if (auto low = detail::cpu_reduced_dtype({x_in}))
    return detail::in_f32(*low, {x_in, weight, bias}, [&](const auto& in) {
      return batch_norm(in[0], in[1], in[2], running_mean, running_var, training, momentum, eps);
    });
  LOCKSTEP_CHECK(x_in.defined() && x_in.dim() >= 2,
                 "batch_norm: expected input [N, C] or [N, C, ...], got {}",
                 x_in.defined() ? shape_str(x_in.shape()) : std::string("undefined"));
  const int64_t c = x_in.size(1);
  int64_t inner = 1;
  for (int64_t d = 2; d < x_in.dim(); ++d) inner *= x_in.size(d);
  const ChannelShape s{x_in.size(0), c, inner};
  check_param("batch_norm", "weight", weight, {c}, x_in);
  check_param("batch_norm", "bias", bias, {c}, x_in);
  for (const Tensor* r : {&running_mean, &running_var}) {
    if (!r->defined()) continue;
    LOCKSTEP_CHECK(r->shape() == Shape{c} && is_floating(r->dtype()),
                   "batch_norm: expected running statistics of shape [{}] (floating), got {}",
                   c, shape_str(r->shape()));
    LOCKSTEP_CHECK(r->device() == x_in.device(),
                   "batch_norm: input is on {} but the running statistics are on {}; move "
                   "them with .to(device)",
                   x_in.device().str(), r->device().str());
  }
  LOCKSTEP_CHECK(running_mean.defined() == running_var.defined(),
                 "batch_norm: give both running_mean and running_var, or neither");
  LOCKSTEP_CHECK(training || running_mean.defined(),
                 "batch_norm: eval mode normalises with the running statistics, but none were "
                 "given; pass running_mean/running_var or use training = true");
  // In eval the output depends on the running statistics, but they are read
  // as constants, never recorded: refused, as PyTorch refuses them, rather
  // than given a gradient of zero.
  LOCKSTEP_CHECK(training || !grad_enabled() ||
                     !(running_mean.requires_grad() || running_var.requires_grad()),
                 "batch_norm: in eval mode the running statistics get no gradient, but "
                 "running_mean or running_var requires grad; pass them .detach()ed (or "
                 "as buffers without requires_grad)");
  // No channels: nothing to normalise (cuDNN would be handed zero-sized dims).
  if (s.c == 0) return empty_batch_norm(x_in, weight, bias);
  LOCKSTEP_CHECK(!training || s.count() != 1,
                 "batch_norm: expected more than 1 value per channel when training (or none: "
                 "an empty batch), got input {}",
                 shape_str(x_in.shape()));
  if (s.count() == 0) return empty_batch_norm(x_in, weight, bias);
  const Tensor x = x_in.contiguous();
  const Tensor w = weight.defined() ? weight.contiguous() : Tensor();
  const Tensor b = bias.defined() ? bias.contiguous() : Tensor();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  const NormStats stats =
      x.device().is_cpu()
          ? cpu_batch_norm_forward(s, x, w, b, running_mean, running_var, training, momentum,
                                   eps, out)
          : device_backend(x.device())
                .batch_norm_forward(x, w, b, running_mean, running_var, training, momentum, eps,
                                    out);

  const AffineInputs graph = affine_inputs(x_in, x, weight, w, bias);
  const int w_at = graph.w_at, b_at = graph.b_at;
  return record(
      std::move(out), training ? "BatchNormBackward" : "BatchNormEvalBackward", graph.inputs,
      graph.saved, [s, stats, training, eps, w_at, b_at](const BackwardArgs& a) {
        const Tensor& xs = a.saved[0];
        const Tensor ws = w_at >= 0 ? a.saved[1] : Tensor();
        const Tensor gy = a.grad.contiguous();
        const Device device = xs.device();
        std::vector<Tensor> grads(a.needs.size());
        if (a.needs[0]) grads[0] = Tensor::empty(xs.shape(), xs.dtype(), device);
        if (w_at >= 0 && a.needs[w_at]) grads[w_at] = Tensor::empty({s.c}, xs.dtype(), device);
        if (b_at >= 0 && a.needs[b_at]) grads[b_at] = Tensor::empty({s.c}, xs.dtype(), device);
        Tensor none;
        Tensor& gw = w_at >= 0 ? grads[w_at] : none;
        Tensor& gb = b_at >= 0 ? grads[b_at] : none;
        if (device.is_cpu()) {
          cpu_batch_norm_backward(s, gy, xs, ws, stats, training, grads[0], gw, gb);
        } else {
          device_backend(device).batch_norm_backward(gy, xs, ws, stats, training, eps, grads[0],
                                                     gw, gb);
        }
        return grads;
      });
}

Tensor layer_norm(const Tensor& x_in, const std::vector<int64_t>& normalized_shape,
                  const Tensor& weight, const Tensor& bias, double eps) {
  if (auto c = detail::autocast_inputs(detail::CastPolicy::f32, {x_in, weight, bias}))
    return layer_norm((*c)[0], normalized_shape, (*c)[1], (*c)[2], eps);
  if (auto low = detail::cpu_reduced_dtype({x_in}))  // as batch_norm's
    return detail::in_f32(*low, {x_in, weight, bias}, [&](const auto& in) {
      return layer_norm(in[0], normalized_shape, in[1], in[2], eps);
    });
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  LOCKSTEP_CHECK(x_in.defined(), "layer_norm: input is undefined");
  bool trailing = k >= 1 && x_in.dim() >= k;
  for (int64_t i = 0; trailing && i < k; ++i)
    trailing = x_in.size(x_in.dim() - k + i) == normalized_shape[i];
  LOCKSTEP_CHECK(trailing,
                 "layer_norm: normalized_shape {} must be non-empty and match the trailing "
                 "dims of the input {}",
                 shape_str(normalized_shape), shape_str(x_in.shape()));
  check_param("layer_norm", "weight", weight, normalized_shape, x_in);
  check_param("layer_norm", "bias", bias, normalized_shape, x_in);
  const Tensor x = x_in.contiguous();
  const Tensor w = weight.defined() ? weight.contiguous() : Tensor();
  const Tensor b = bias.defined() ? bias.contiguous() : Tensor();
  const int64_t d = shape_numel(normalized_shape);
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  NormStats stats;
  if (!x.device().is_cpu()) {
    stats = device_backend(x.device()).layer_norm_forward(x, w, b, rows, d, eps, out);
  } else {
    stats = {Tensor::empty({rows}, DType::f64), Tensor::empty({rows}, DType::f64)};
    dispatch_float(x.dtype(), "layer_norm", [&](auto tag) {
      using T = decltype(tag);
      norm_kernels::layer_norm_forward<T>(rows, d, x.data_ptr<T>(),
                                          w.defined() ? w.data_ptr<T>() : nullptr,
                                          b.defined() ? b.data_ptr<T>() : nullptr, eps,
                                          out.data_ptr<T>(), stats.mean.data_ptr<double>(),
                                          stats.invstd.data_ptr<double>());
    });
  }

  const AffineInputs graph = affine_inputs(x_in, x, weight, w, bias);
  const int w_at = graph.w_at, b_at = graph.b_at;
  return record(
      std::move(out), "LayerNormBackward", graph.inputs, graph.saved,
      [rows, d, stats, w_at, b_at, pshape = normalized_shape](const BackwardArgs& a) {
        const Tensor& xs = a.saved[0];
        const Tensor ws = w_at >= 0 ? a.saved[1] : Tensor();
        const Tensor gy = a.grad.contiguous();
        const Device device = xs.device();
        std::vector<Tensor> grads(a.needs.size());
        if (a.needs[0]) grads[0] = Tensor::empty(xs.shape(), xs.dtype(), device);
        if (w_at >= 0 && a.needs[w_at]) grads[w_at] = Tensor::empty(pshape, xs.dtype(), device);
        if (b_at >= 0 && a.needs[b_at]) grads[b_at] = Tensor::empty(pshape, xs.dtype(), device);
        if (!device.is_cpu()) {
          Tensor none;
          device_backend(device).layer_norm_backward(gy, xs, ws, stats, rows, d, grads[0],
                                                     w_at >= 0 ? grads[w_at] : none,
                                                     b_at >= 0 ? grads[b_at] : none);
          return grads;
        }
        dispatch_float(gy.dtype(), "layer_norm backward", [&](auto tag) {
          using T = decltype(tag);
          auto ptr = [&](int at) -> T* {
            return at >= 0 && grads[at].defined() ? grads[at].data_ptr<T>() : nullptr;
          };
          norm_kernels::layer_norm_backward<T>(
              rows, d, gy.data_ptr<T>(), xs.data_ptr<T>(), ws.defined() ? ws.data_ptr<T>() : nullptr,
              stats.mean.data_ptr<double>(), stats.invstd.data_ptr<double>(), ptr(0), ptr(w_at),
              ptr(b_at));
        });
        return grads;
      });
}

}  // namespace lockstep::runtime
