#include "lockstep/runtime/ops/scale_into.h"

#include "lockstep/runtime/cpu/simd.h"
#include "lockstep/runtime/device_backend.h"

namespace lockstep::runtime {

void scale_into(Tensor& dst, const Tensor& src, double scale) {
  const bool same_layout = src.device() == dst.device() && src.dtype() == dst.dtype() &&
                           dst.numel() == src.numel();
  if (same_layout && dst.device().is_cpu() && dst.dtype() == DType::f32 &&
      dst.is_contiguous() && src.is_contiguous()) {
    float* d = dst.data_ptr<float>();
    const float* s = src.data_ptr<float>();
    const float f = static_cast<float>(scale);
    const int64_t n = dst.numel();
    // Explicit vectors: the compiler kept this loop scalar (it may alias).
    using cpu::kLanes;
    const auto vf = cpu::splat(f);
    int64_t i = 0;
    for (; i + 4 * kLanes<float> <= n; i += 4 * kLanes<float>) {
      for (int u = 0; u < 4; ++u) {
        const int64_t k = i + u * kLanes<float>;
        cpu::store(d + k, cpu::load(s + k) * vf);
      }
    }
    for (; i < n; ++i) d[i] = s[i] * f;
    dst.storage()->bump_version();
    return;
  }
  if (same_layout && !dst.device().is_cpu()) {
    device_backend(dst.device()).scale_into(dst, src, scale);
    dst.storage()->bump_version();
    return;
  }
  dst.copy_(src);
  if (scale != 1.0) dst.mul_(scale);
}

}  // namespace lockstep::runtime
