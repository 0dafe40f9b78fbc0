// Pooling ops: argument checks and autograd wiring for every device; loops in
// pool_kernels.cpp on the CPU, the device backend's kernels elsewhere.
#include "lockstep/runtime/ops/pool.h"

#include <cstdint>

#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/device_backend.h"
#include "lockstep/runtime/ops/detail/reduced_float.h"
#include "lockstep/runtime/ops/pool_kernels.h"

namespace lockstep::runtime {
namespace {

using pool_kernels::PoolShape;

// Accepts [N, C, H, W] or [C, H, W]; the leading dims become planes.
PoolShape planes_of(const char* op, const Tensor& x) {
  LOCKSTEP_CHECK(x.defined(), "{}: input is undefined", op);
  LOCKSTEP_CHECK((x.dim() == 4 || x.dim() == 3) && x.size(-1) > 0 && x.size(-2) > 0,
                 "{}: expected input [N, C, H, W] or [C, H, W] with H, W > 0, got {}", op,
                 shape_str(x.shape()));
  PoolShape s;
  s.h = x.size(-2), s.w = x.size(-1);
  s.planes = x.numel() / (s.h * s.w);
  return s;
}

// PyTorch's pooling_output_shape (dilation 1): windows that fit, or with
// ceil_mode one more for a partial window, unless it would start at or past
// the end of the input and its bottom / right padding.
int64_t output_size(int64_t in, int64_t k, int64_t stride, int64_t pad, bool ceil_mode) {
  const int64_t span = in + 2 * pad - k;  // >= 0, checked by the caller
  int64_t out = (span + (ceil_mode ? stride - 1 : 0)) / stride + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

PoolShape window_shape(const char* op, const Tensor& x, const Pool2dOptions& o) {
  PoolShape s = planes_of(op, x);
  s.kh = o.kernel[0], s.kw = o.kernel[1];
  s.sh = o.stride[0] == 0 ? s.kh : o.stride[0];
  s.sw = o.stride[1] == 0 ? s.kw : o.stride[1];
  s.ph = o.padding[0], s.pw = o.padding[1];
  LOCKSTEP_CHECK(s.kh > 0 && s.kw > 0 && s.sh > 0 && s.sw > 0,
                 "{}: kernel and stride must be positive, got kernel [{}, {}], stride [{}, {}]",
                 op, s.kh, s.kw, s.sh, s.sw);
  LOCKSTEP_CHECK(s.ph >= 0 && s.pw >= 0 && 2 * s.ph <= s.kh && 2 * s.pw <= s.kw,
                 "{}: padding [{}, {}] must be >= 0 and at most half the kernel [{}, {}]", op,
                 s.ph, s.pw, s.kh, s.kw);
  LOCKSTEP_CHECK(s.h + 2 * s.ph >= s.kh && s.w + 2 * s.pw >= s.kw,
                 "{}: input {} with padding [{}, {}] is smaller than the kernel [{}, {}]", op,
                 shape_str(x.shape()), s.ph, s.pw, s.kh, s.kw);
  s.oh = output_size(s.h, s.kh, s.sh, s.ph, o.ceil_mode);
  s.ow = output_size(s.w, s.kw, s.sw, s.pw, o.ceil_mode);
  return s;
}

Shape out_shape(const Tensor& x, const PoolShape& s) {
  Shape shape = x.shape();
  shape[shape.size() - 2] = s.oh;
  shape[shape.size() - 1] = s.ow;
  return shape;
}

bool on_device(const Tensor& t) { return !t.device().is_cpu(); }

// Shared wiring of the two average pools (their kernels have the same shape).
template <class Fwd, class Bwd>
Tensor average_pool(const char* op, const char* node, bool adaptive, const Tensor& x_in,
                    const PoolShape& s, Fwd forward, Bwd backward) {
  if (auto low = detail::cpu_reduced_dtype({x_in}))
    return detail::in_f32(*low, {x_in}, [&](const auto& in) {
      return average_pool(op, node, adaptive, in[0], s, forward, backward);
    });
  const Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty(out_shape(x, s), x.dtype(), x.device());
  if (on_device(x)) {
    device_backend(x.device()).avg_pool2d_forward(s, adaptive, x, out);
  } else {
    dispatch_float(x.dtype(), op, [&](auto tag) {
      using T = decltype(tag);
      forward(s, x.data_ptr<T>(), out.data_ptr<T>());
    });
  }
  return record(std::move(out), node, {x_in}, {},
                [s, in_shape = x.shape(), op, adaptive, backward](const BackwardArgs& a) {
                  const Tensor gy = a.grad.contiguous();
                  Tensor gx = Tensor::empty(in_shape, gy.dtype(), gy.device());
                  if (on_device(gy)) {
                    device_backend(gy.device()).avg_pool2d_backward(s, adaptive, gy, gx);
                  } else {
                    dispatch_float(gy.dtype(), op, [&](auto tag) {
                      using T = decltype(tag);
                      backward(s, gy.data_ptr<T>(), gx.data_ptr<T>());
                    });
                  }
                  return std::vector<Tensor>{gx};
                });
}

}  // namespace

Tensor max_pool2d(const Tensor& x_in, const Pool2dOptions& opts) {
  const PoolShape s = window_shape("max_pool2d", x_in, opts);
  if (auto low = detail::cpu_reduced_dtype({x_in}))
    return detail::in_f32(*low, {x_in}, [&](const auto& in) { return max_pool2d(in[0], opts); });
  const Tensor x = x_in.contiguous();
  LOCKSTEP_CHECK(s.h * s.w <= INT32_MAX, "max_pool2d: an H x W plane of {} elements is too large (at most 2^31 - 1)",
                 s.h * s.w);
  Tensor out = Tensor::empty(out_shape(x, s), x.dtype(), x.device());
  // Flat in-plane index of each window's maximum; internal, so i32 halves
  // its memory traffic compared with PyTorch's i64 indices.
  Tensor argmax = Tensor::empty(out.shape(), DType::i32, x.device());
  if (on_device(x)) {
    device_backend(x.device()).max_pool2d_forward(s, x, out, argmax);
  } else {
    dispatch_float(x.dtype(), "max_pool2d", [&](auto tag) {
      using T = decltype(tag);
      pool_kernels::max_pool_forward<T>(s, x.data_ptr<T>(), out.data_ptr<T>(),
                                        argmax.data_ptr<int32_t>());
    });
  }
  // The indices are saved, not captured: backward frees them (and a second
  // backward without retain_graph is an error), as PyTorch's saved indices.
  return record(std::move(out), "MaxPool2dBackward", {x_in}, {argmax},
                [s, in_shape = x.shape()](const BackwardArgs& a) {
                  const Tensor& argmax = a.saved[0];
                  const Tensor gy = a.grad.contiguous();
                  Tensor gx = Tensor::empty(in_shape, gy.dtype(), gy.device());
                  if (on_device(gy)) {
                    device_backend(gy.device()).max_pool2d_backward(s, gy, argmax, gx);
                  } else {
                    dispatch_float(gy.dtype(), "max_pool2d backward", [&](auto tag) {
                      using T = decltype(tag);
                      pool_kernels::max_pool_backward<T>(s, gy.data_ptr<T>(),
                                                         argmax.data_ptr<int32_t>(),
                                                         gx.data_ptr<T>());
                    });
                  }
                  return std::vector<Tensor>{gx};
                });
}

Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& opts) {
  const PoolShape s = window_shape("avg_pool2d", x, opts);
  return average_pool(
      "avg_pool2d", "AvgPool2dBackward", /*adaptive=*/false, x, s,
      [](const PoolShape& sh, const auto* in, auto* out) {
        pool_kernels::avg_pool_forward(sh, in, out);
      },
      [](const PoolShape& sh, const auto* gy, auto* gx) {
        pool_kernels::avg_pool_backward(sh, gy, gx);
      });
}

Tensor adaptive_avg_pool2d(const Tensor& x, std::array<int64_t, 2> output_size) {
  PoolShape s = planes_of("adaptive_avg_pool2d", x);
  LOCKSTEP_CHECK(output_size[0] > 0 && output_size[1] > 0,
                 "adaptive_avg_pool2d: output size must be positive, got [{}, {}]",
                 output_size[0], output_size[1]);
  s.oh = output_size[0], s.ow = output_size[1];
  return average_pool(
      "adaptive_avg_pool2d", "AdaptiveAvgPool2dBackward", /*adaptive=*/true, x, s,
      [](const PoolShape& sh, const auto* in, auto* out) {
        pool_kernels::adaptive_avg_pool_forward(sh, in, out);
      },
      [](const PoolShape& sh, const auto* gy, auto* gx) {
        pool_kernels::adaptive_avg_pool_backward(sh, gy, gx);
      });
}

}  // namespace lockstep::runtime
