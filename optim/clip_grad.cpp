#include "lockstep/optim/clip_grad.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/device_backend.h"
#include "lockstep/runtime/error.h"

namespace lockstep::optim {

namespace {

bool is_inf_norm(double norm_type) { return std::isinf(norm_type) && norm_type > 0; }

void check_norm_type(double norm_type) {
  LOCKSTEP_CHECK(norm_type > 0.0,
                 "clip_grad_norm: norm_type {} is not a norm; use a p > 0 (2 is the usual one) or "
                 "infinity",
                 norm_type);
}

// sum |g|^p (or max |g|) over one gradient, in double: every floating dtype,
// as the optimizers step bf16 and f16 parameters too.
double partial_of(const Tensor& grad, double norm_type) {
  // Read on the host, in double, as on the CPU: a CUDA gradient is copied
  // over first (the norm is a host number anyway, so the wait is inherent).
  const Tensor g =
      grad.device().is_cpu() ? grad.contiguous() : grad.detach().to(runtime::Device::cpu());
  return runtime::dispatch_floating(g.dtype(), "clip_grad_norm", [&](auto tag) {
    using T = decltype(tag);
    const T* x = g.data_ptr<T>();
    const int64_t n = g.numel();
    double acc = 0.0;
    if (is_inf_norm(norm_type)) {
      for (int64_t i = 0; i < n; ++i) {
        const double a = std::abs(static_cast<double>(x[i]));
        // NaN must not vanish into a max: it makes the whole norm NaN.
        acc = (a > acc || std::isnan(a)) ? a : acc;
      }
    } else if (norm_type == 2.0) {
      for (int64_t i = 0; i < n; ++i) {
        const auto v = static_cast<double>(x[i]);
        acc += v * v;
      }
    } else if (norm_type == 1.0) {
      for (int64_t i = 0; i < n; ++i) acc += std::abs(static_cast<double>(x[i]));
    } else {
      for (int64_t i = 0; i < n; ++i) acc += std::pow(std::abs(static_cast<double>(x[i])), norm_type);
    }
    return acc;
  });
}

}  // namespace

double grad_norm_partial(const std::vector<Tensor>& params, double norm_type) {
  check_norm_type(norm_type);
  double acc = 0.0;
  for (const auto& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    const double part = partial_of(p.grad(), norm_type);
    if (is_inf_norm(norm_type))
      acc = (part > acc || std::isnan(part)) ? part : acc;
    else
      acc += part;
  }
  return acc;
}

double norm_from_partial(double partial, double norm_type) {
  check_norm_type(norm_type);
  if (is_inf_norm(norm_type)) return partial;
  if (norm_type == 2.0) return std::sqrt(partial);
  if (norm_type == 1.0) return partial;
  return std::pow(partial, 1.0 / norm_type);
}

double total_grad_norm(const std::vector<Tensor>& params, double norm_type) {
  return norm_from_partial(grad_norm_partial(params, norm_type), norm_type);
}

double clip_grads_with_norm(const std::vector<Tensor>& params, double max_norm, double total_norm) {
  LOCKSTEP_CHECK(max_norm >= 0.0,
                 "clip_grad_norm: max_norm must be a number >= 0 (the largest total norm to "
                 "allow), got {}",
                 max_norm);
  // PyTorch's rule: scale = max_norm / (total + 1e-6), applied only when < 1
  // (a NaN scale is applied too, so non-finite gradients stay visible).
  const double scale = max_norm / (total_norm + 1e-6);
  if (scale >= 1.0) return 1.0;
  runtime::NoGradGuard no_grad;
  for (const auto& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    Tensor g = p.grad();
    g.mul_(scale);
  }
  return scale;
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type,
                      bool error_if_nonfinite) {
  const double total = total_grad_norm(params, norm_type);
  LOCKSTEP_CHECK(!error_if_nonfinite || std::isfinite(total),
                 "clip_grad_norm: the total norm of order {} of the gradients is {}; some "
                 "gradient holds NaN or infinity (check the loss and the learning rate), or pass "
                 "error_if_nonfinite = false to clip anyway",
                 norm_type, total);
  clip_grads_with_norm(params, max_norm, total);
  return total;
}

void clip_grad_value(const std::vector<Tensor>& params, double clip_value) {
  LOCKSTEP_CHECK(clip_value >= 0.0,
                 "clip_grad_value: clip_value must be a number >= 0 (gradients are clamped to "
                 "[-clip_value, clip_value]), got {}",
                 clip_value);
  runtime::NoGradGuard no_grad;
  for (const auto& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    Tensor g = p.grad();
    if (!g.device().is_cpu()) {  // the backend's maximum/minimum, which keep NaN
      const auto& backend = runtime::device_backend(g.device());
      const Tensor lo = Tensor::full({}, -clip_value, g.dtype(), g.device());
      const Tensor hi = Tensor::full({}, clip_value, g.dtype(), g.device());
      const Tensor clamped = backend.binary(
          runtime::BinaryOp::minimum,
          backend.binary(runtime::BinaryOp::maximum, g, lo, g.dtype(), 1.0, "clip_grad_value"),
          hi, g.dtype(), 1.0, "clip_grad_value");
      g.copy_(clamped);
      continue;
    }
    const bool in_place = g.is_contiguous();
    const Tensor c = in_place ? g : g.contiguous();
    runtime::dispatch_floating(c.dtype(), "clip_grad_value", [&](auto tag) {
      using T = decltype(tag);
      T* x = c.data_ptr<T>();
      const auto lo = static_cast<T>(-clip_value), hi = static_cast<T>(clip_value);
      for (int64_t i = 0, n = c.numel(); i < n; ++i) {
        const double v = static_cast<double>(x[i]);  // NaN fails both tests: kept
        if (v < -clip_value) x[i] = lo;
        else if (v > clip_value) x[i] = hi;
      }
    });
    if (!in_place) g.copy_(c);
  }
}

}  // namespace lockstep::optim
