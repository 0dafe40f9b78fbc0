#include "lockstep/runtime/ops/amp.h"

#include <cmath>
#include <type_traits>

#include "lockstep/runtime/device_backend.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/half.h"
#include "lockstep/runtime/ops/detail/convert.h"
#include "lockstep/runtime/ops/detail/strided_loop.h"

namespace lockstep::runtime {

namespace {

void check_one(const char* op, const char* what, const Tensor& t, DType dtype, Device device) {
  LOCKSTEP_CHECK(t.defined() && t.numel() == 1 && t.dtype() == dtype && t.device() == device,
                 "{}: {} must be a 1-element {} tensor on {}; got {}", op, what,
                 dtype_name(dtype), device.str(), t.defined() ? t.str() : "undefined");
}

// PyTorch's rule: inv_scale == 1 leaves the values as they are.
template <class T>
bool unscale_cpu(const Tensor& g, float inv_scale) {
  using C = std::conditional_t<detail::is_half_v<T>, float, T>;
  const C s = static_cast<C>(inv_scale);
  const bool scaling = inv_scale != 1.0f;
  T* base = static_cast<T*>(g.raw_data());
  bool found = false;
  detail::strided_loop<1>(g.shape(), {g.strides()},
                          [&](const std::array<int64_t, 1>& off, int64_t n,
                              const std::array<int64_t, 1>& st) {
                            T* p = base + off[0];
                            const int64_t step = st[0];
                            for (int64_t i = 0; i < n; ++i) {
                              const C v = detail::convert<C>(p[i * step]);
                              found |= !std::isfinite(v);
                              if (scaling) p[i * step] = detail::convert<T>(v * s);
                            }
                          });
  return found;
}

}  // namespace

void amp_unscale_(const std::vector<Tensor>& grads, const Tensor& found_inf,
                  const Tensor& inv_scale) {
  constexpr const char* op = "amp_unscale_";
  LOCKSTEP_CHECK(found_inf.defined(), "{}: found_inf is undefined", op);
  const Device device = found_inf.device();
  check_one(op, "found_inf", found_inf, DType::f32, device);
  check_one(op, "inv_scale", inv_scale, DType::f32, device);
  for (const Tensor& g : grads) {
    LOCKSTEP_CHECK(g.defined(), "{}: a gradient is undefined", op);
    LOCKSTEP_CHECK(g.device() == device, "{}: a gradient is on {}, found_inf on {}", op,
                   g.device().str(), device.str());
    const DType d = g.dtype();
    LOCKSTEP_CHECK(d == DType::f32 || d == DType::f64 || d == DType::bf16 || d == DType::f16,
                   "{}: gradients must be f32, f64, bf16 or f16; got {}", op, dtype_name(d));
    // Each element is divided in place: an expanded gradient's one value
    // would be divided once per element (PyTorch refuses the write too).
    for (int64_t k = 0; k < g.dim(); ++k) {
      LOCKSTEP_CHECK(g.strides()[k] != 0 || g.shape()[k] <= 1,
                     "{}: a gradient (shape {}, strides {}) has several elements at one memory "
                     "location (an expanded tensor); set the gradient to a .clone() of it",
                     op, shape_str(g.shape()), shape_str(g.strides()));
    }
  }
  if (!device.is_cpu()) {
    if (!grads.empty()) device_backend(device).amp_unscale(grads, found_inf, inv_scale);
  } else {
    const float inv = *inv_scale.data_ptr<float>();
    bool found = false;
    for (const Tensor& g : grads) {
      switch (g.dtype()) {
        case DType::f32: found |= unscale_cpu<float>(g, inv); break;
        case DType::f64: found |= unscale_cpu<double>(g, inv); break;
        case DType::bf16: found |= unscale_cpu<bf16>(g, inv); break;
        default: found |= unscale_cpu<f16>(g, inv); break;
      }
    }
    if (found) *found_inf.data_ptr<float>() = 1.0f;
  }
  for (const Tensor& g : grads) g.storage()->bump_version();
  found_inf.storage()->bump_version();
}

void amp_update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                       double growth_factor, double backoff_factor, int64_t growth_interval) {
  constexpr const char* op = "amp_update_scale_";
  LOCKSTEP_CHECK(scale.defined(), "{}: scale is undefined", op);
  const Device device = scale.device();
  check_one(op, "scale", scale, DType::f32, device);
  check_one(op, "growth_tracker", growth_tracker, DType::i32, device);
  check_one(op, "found_inf", found_inf, DType::f32, device);
  LOCKSTEP_CHECK(growth_interval > 0, "{}: growth_interval must be positive, got {}", op,
                 growth_interval);
  if (!device.is_cpu()) {
    device_backend(device).amp_update_scale(scale, growth_tracker, found_inf, growth_factor,
                                            backoff_factor, growth_interval);
  } else {
    // PyTorch's arithmetic: the product in double, stored as float.
    float& s = *scale.data_ptr<float>();
    int32_t& tracker = *growth_tracker.data_ptr<int32_t>();
    if (*found_inf.data_ptr<float>() != 0.0f) {
      s = static_cast<float>(s * backoff_factor);
      tracker = 0;
    } else if (const int64_t successful = int64_t{tracker} + 1; successful == growth_interval) {
      const auto grown = static_cast<float>(s * growth_factor);
      if (std::isfinite(grown)) s = grown;
      tracker = 0;
    } else {
      tracker = static_cast<int32_t>(successful);
    }
  }
  scale.storage()->bump_version();
  growth_tracker.storage()->bump_version();
}

}  // namespace lockstep::runtime
