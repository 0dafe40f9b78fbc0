// conv2d: argument checks and autograd wiring for every device; the
// arithmetic in conv_kernels.cpp on the CPU, elsewhere the device backend's
// kernels (cuDNN for CUDA).
#include "lockstep/runtime/ops/conv.h"

#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/device_backend.h"
#include "lockstep/runtime/ops/conv_kernels.h"
#include "lockstep/runtime/ops/detail/reduced_float.h"

namespace lockstep::runtime {
namespace {

using conv_kernels::ConvShape;

ConvShape check_and_shape(const Tensor& x, const Tensor& weight, const Tensor& bias,
                          const Conv2dOptions& o) {
  LOCKSTEP_CHECK(x.defined() && weight.defined(), "conv2d: input and weight must be defined");
  LOCKSTEP_CHECK(weight.device() == x.device() && (!bias.defined() || bias.device() == x.device()),
                 "conv2d: input is on {} but the weight is on {}{}; move them to one device "
                 "with .to(device)",
                 x.device().str(), weight.device().str(),
                 bias.defined() ? " and the bias on " + bias.device().str() : std::string());
  LOCKSTEP_CHECK(weight.dim() == 4,
                 "conv2d: expected weight [C_out, C_in / groups, kH, kW], got {}",
                 shape_str(weight.shape()));
  LOCKSTEP_CHECK(o.groups >= 1, "conv2d: groups must be >= 1, got {}", o.groups);
  for (int d = 0; d < 2; ++d) {
    LOCKSTEP_CHECK(o.stride[d] >= 1 && o.dilation[d] >= 1 && o.padding[d] >= 0,
                   "conv2d: stride and dilation must be >= 1 and padding >= 0, got stride "
                   "[{}, {}], padding [{}, {}], dilation [{}, {}]",
                   o.stride[0], o.stride[1], o.padding[0], o.padding[1], o.dilation[0],
                   o.dilation[1]);
  }
  const int64_t c_out = weight.size(0), cin_g = weight.size(1);
  LOCKSTEP_CHECK(c_out % o.groups == 0,
                 "conv2d: weight's out_channels {} is not divisible by groups {}", c_out,
                 o.groups);
  LOCKSTEP_CHECK(x.dim() == 4 && x.size(1) == cin_g * o.groups,
                 "conv2d: expected input [N, C, H, W] with C = {} (weight's in_channels * "
                 "groups), got {}",
                 cin_g * o.groups, shape_str(x.shape()));
  LOCKSTEP_CHECK(weight.dtype() == x.dtype(), "conv2d: input is {} but weight is {}; convert "
                 "one of them with .to()", dtype_name(x.dtype()), dtype_name(weight.dtype()));
  if (bias.defined()) {
    LOCKSTEP_CHECK(bias.dim() == 1 && bias.size(0) == c_out,
                   "conv2d: expected bias [{}] (weight's out_channels), got {}", c_out,
                   shape_str(bias.shape()));
    LOCKSTEP_CHECK(bias.dtype() == x.dtype(), "conv2d: input is {} but bias is {}",
                   dtype_name(x.dtype()), dtype_name(bias.dtype()));
  }
  ConvShape s;
  s.n = x.size(0), s.c_in = x.size(1), s.h = x.size(2), s.w = x.size(3);
  s.c_out = c_out, s.kh = weight.size(2), s.kw = weight.size(3);
  s.sh = o.stride[0], s.sw = o.stride[1], s.ph = o.padding[0], s.pw = o.padding[1];
  s.dh = o.dilation[0], s.dw = o.dilation[1], s.groups = o.groups;
  const int64_t span_h = s.dh * (s.kh - 1) + 1, span_w = s.dw * (s.kw - 1) + 1;
  LOCKSTEP_CHECK(s.h + 2 * s.ph >= span_h && s.w + 2 * s.pw >= span_w,
                 "conv2d: the (dilated) kernel {}x{} is larger than the padded input {}x{} "
                 "(input {}, padding [{}, {}])",
                 span_h, span_w, s.h + 2 * s.ph, s.w + 2 * s.pw, shape_str(x.shape()), s.ph,
                 s.pw);
  s.oh = (s.h + 2 * s.ph - span_h) / s.sh + 1;
  s.ow = (s.w + 2 * s.pw - span_w) / s.sw + 1;
  return s;
}

}  // namespace

Tensor conv2d(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in,
              const Conv2dOptions& opts) {
  if (auto c = detail::autocast_inputs(detail::CastPolicy::lower, {x_in, weight_in, bias_in}))
    return conv2d((*c)[0], (*c)[1], (*c)[2], opts);
  const ConvShape s = check_and_shape(x_in, weight_in, bias_in, opts);
  if (auto low = detail::cpu_reduced_dtype({x_in, weight_in, bias_in}))
    return detail::in_f32(*low, {x_in, weight_in, bias_in},
                          [&](const auto& in) { return conv2d(in[0], in[1], in[2], opts); });
  const Tensor x = x_in.contiguous();
  const Tensor weight = weight_in.contiguous();
  const Tensor bias = bias_in.defined() ? bias_in.contiguous() : Tensor();
  Tensor out = Tensor::empty({s.n, s.c_out, s.oh, s.ow}, x.dtype(), x.device());
  if (!x.device().is_cpu()) {
    device_backend(x.device()).conv2d_forward(s, x, weight, bias, out);
  } else {
    dispatch_float(x.dtype(), "conv2d", [&](auto tag) {
      using T = decltype(tag);
      conv_kernels::conv2d_forward<T>(s, x.data_ptr<T>(), weight.data_ptr<T>(),
                                      bias.defined() ? bias.data_ptr<T>() : nullptr,
                                      out.data_ptr<T>());
    });
  }

  std::vector<Tensor> inputs{x_in, weight_in};
  if (bias_in.defined()) inputs.push_back(bias_in);
  return record(std::move(out), "Conv2dBackward", inputs, {x, weight},
                [s](const BackwardArgs& a) -> std::vector<Tensor> {
                  const Tensor& xs = a.saved[0];
                  const Tensor& ws = a.saved[1];
                  const Tensor gy = a.grad.contiguous();
                  std::vector<Tensor> grads(a.needs.size());
                  const Device device = xs.device();
                  if (a.needs[0]) grads[0] = Tensor::empty(xs.shape(), xs.dtype(), device);
                  if (a.needs[1]) grads[1] = Tensor::empty(ws.shape(), ws.dtype(), device);
                  if (a.needs.size() > 2 && a.needs[2])
                    grads[2] = Tensor::empty({s.c_out}, ws.dtype(), device);
                  if (!device.is_cpu()) {
                    Tensor no_bias;
                    device_backend(device).conv2d_backward(
                        s, xs, ws, gy, grads[0], grads[1], grads.size() > 2 ? grads[2] : no_bias);
                    return grads;
                  }
                  dispatch_float(gy.dtype(), "conv2d backward", [&](auto tag) {
                    using T = decltype(tag);
                    auto ptr = [](const Tensor& t) {
                      return t.defined() ? t.data_ptr<T>() : nullptr;
                    };
                    conv_kernels::conv2d_backward<T>(
                        s, xs.data_ptr<T>(), ws.data_ptr<T>(), gy.data_ptr<T>(),
                        ptr(grads[0]), ptr(grads[1]), grads.size() > 2 ? ptr(grads[2]) : nullptr);
                  });
                  return grads;
                });
}

}  // namespace lockstep::runtime
