// batch_norm and layer_norm: argument checks for every device. layer_norm's
// autograd wiring is here for every device, with its loops in
// norm_kernels.cpp on the CPU and the device backend's kernels elsewhere;
// batch_norm's wiring is here for the CPU, elsewhere the backend's whole op.
#include "lockstep/runtime/ops/norm.h"

#include <cmath>
#include <memory>

#include "lockstep/runtime/autograd/affine_inputs.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/device_backend.h"
#include "lockstep/runtime/ops/norm_kernels.h"

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

// Batch norm's statistics of one call, per channel, in double. Shared with
// the backward closure.
struct Stats {
  std::vector<double> mean, invstd;
};

}  // namespace

Tensor batch_norm(const Tensor& x_in, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum, double eps) {
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
  LOCKSTEP_CHECK(!training || s.count() > 1,
                 "batch_norm: expected more than 1 value per channel when training, got input {}",
                 shape_str(x_in.shape()));
  if (!x_in.device().is_cpu())
    return device_backend(x_in.device())
        .batch_norm(x_in, weight, bias, running_mean, running_var, training, momentum, eps);

  const Tensor x = x_in.contiguous();
  auto co = std::make_shared<Stats>();
  co->mean.resize(c);
  co->invstd.resize(c);
  if (training) {
    std::vector<double> var(c);
    dispatch_float(x.dtype(), "batch_norm", [&](auto tag) {
      using T = decltype(tag);
      norm_kernels::channel_stats<T>(s, x.data_ptr<T>(), co->mean.data(), var.data());
    });
    for (int64_t i = 0; i < c; ++i) co->invstd[i] = 1.0 / std::sqrt(var[i] + eps);
    if (running_mean.defined()) {
      // running = (1 - momentum) * running + momentum * batch, with the
      // unbiased variance, as PyTorch. copy_ bumps the buffers' versions;
      // NoGradGuard keeps the update off the tape.
      NoGradGuard no_grad;
      const double unbias = static_cast<double>(s.count()) / (s.count() - 1);
      std::vector<double> rm = values(running_mean), rv = values(running_var);
      for (int64_t i = 0; i < c; ++i) {
        rm[i] = (1 - momentum) * rm[i] + momentum * co->mean[i];
        rv[i] = (1 - momentum) * rv[i] + momentum * var[i] * unbias;
      }
      Tensor(running_mean).copy_(Tensor::from_vector(rm, {c}));
      Tensor(running_var).copy_(Tensor::from_vector(rv, {c}));
    }
  } else {
    co->mean = values(running_mean);
    const std::vector<double> rv = values(running_var);
    for (int64_t i = 0; i < c; ++i) co->invstd[i] = 1.0 / std::sqrt(rv[i] + eps);
  }

  // y = x * scale + shift with scale = w * invstd, shift = b - mean * scale.
  const std::vector<double> w = weight.defined() ? values(weight) : std::vector<double>(c, 1.0);
  const std::vector<double> b = bias.defined() ? values(bias) : std::vector<double>(c, 0.0);
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  dispatch_float(x.dtype(), "batch_norm", [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> scale(c), shift(c);
    for (int64_t i = 0; i < c; ++i) {
      scale[i] = static_cast<T>(w[i] * co->invstd[i]);
      shift[i] = static_cast<T>(b[i] - co->mean[i] * w[i] * co->invstd[i]);
    }
    norm_kernels::channel_affine<T>(s, x.data_ptr<T>(), scale.data(), shift.data(),
                                    out.data_ptr<T>());
  });

  const AffineInputs graph = affine_inputs(x_in, x, weight, weight, bias);
  const int w_at = graph.w_at, b_at = graph.b_at;
  return record(
      std::move(out), training ? "BatchNormBackward" : "BatchNormEvalBackward", graph.inputs,
      graph.saved,
      [s, co, training, w_at, b_at](const BackwardArgs& a) -> std::vector<Tensor> {
        const Tensor& xs = a.saved[0];
        const Tensor gy = a.grad.contiguous();
        const int64_t c = s.c;
        const std::vector<double> w =
            w_at >= 0 ? a.saved[1].to_vector<double>() : std::vector<double>(c, 1.0);
        const bool need_x = a.needs[0];
        const bool need_w = w_at >= 0 && a.needs[w_at];
        const bool need_b = b_at >= 0 && a.needs[b_at];
        std::vector<Tensor> grads(a.needs.size());
        dispatch_float(gy.dtype(), "batch_norm backward", [&](auto tag) {
          using T = decltype(tag);
          const T* g = gy.data_ptr<T>();
          const T* xp = xs.data_ptr<T>();
          std::vector<double> sum_gy(c), sum_gy_xc(c);
          if (need_w || need_b || (training && need_x))
            norm_kernels::channel_grad_sums<T>(s, g, xp, co->mean.data(), sum_gy.data(),
                                               sum_gy_xc.data());
          if (need_x) {
            // Training: gx = w*invstd * (gy - mean(gy) - xhat * mean(gy * xhat)),
            // folded into gx = gy * ka + x * kb + kc. Eval: gx = gy * w * invstd.
            const double m = static_cast<double>(s.count());
            std::vector<T> ka(c), kb(c), kc(c);
            for (int64_t i = 0; i < c; ++i) {
              const double is = co->invstd[i], k1 = w[i] * is;
              double b = 0, k = 0;
              if (training) {
                b = -k1 * is * is * sum_gy_xc[i] / m;
                k = -k1 * sum_gy[i] / m - b * co->mean[i];
              }
              ka[i] = static_cast<T>(k1), kb[i] = static_cast<T>(b), kc[i] = static_cast<T>(k);
            }
            Tensor gx = Tensor::empty(xs.shape(), xs.dtype());
            if (training) {
              norm_kernels::channel_grad_input<T>(s, g, xp, ka.data(), kb.data(), kc.data(),
                                                  gx.data_ptr<T>());
            } else {
              norm_kernels::channel_affine<T>(s, g, ka.data(), kc.data(), gx.data_ptr<T>());
            }
            grads[0] = gx;
          }
          if (need_w) {
            std::vector<double> gw(c);
            for (int64_t i = 0; i < c; ++i) gw[i] = sum_gy_xc[i] * co->invstd[i];
            grads[w_at] = Tensor::from_vector(gw, {c}).to(gy.dtype());
          }
          if (need_b) grads[b_at] = Tensor::from_vector(sum_gy, {c}).to(gy.dtype());
        });
        return grads;
      });
}

Tensor layer_norm(const Tensor& x_in, const std::vector<int64_t>& normalized_shape,
                  const Tensor& weight, const Tensor& bias, double eps) {
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
  RowStats stats;
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
