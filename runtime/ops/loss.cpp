// Cross-entropy (fused log-softmax + NLL, with label smoothing) and MSE.
// cross_entropy checks its arguments and records its node here for every
// device; its kernels are the CPU's below or the device backend's. mse_loss
// is built from ops that run on every device.
#include "lockstep/runtime/ops/loss.h"

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/cpu/vec_math.h"
#include "lockstep/runtime/device_backend.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/reduce.h"
#include "lockstep/runtime/ops/detail/class_rows.h"
#include "lockstep/runtime/ops/detail/reduced_float.h"
#include "lockstep/runtime/ops/detail/soft_targets.h"

namespace lockstep::runtime {

namespace {

Tensor reduce(const Tensor& losses, Reduction r) {
  switch (r) {
    case Reduction::Mean: return mean(losses);
    case Reduction::Sum: return sum(losses);
    case Reduction::None: return losses;
  }
  return losses;
}

bool is_ignored(int64_t target, std::optional<int64_t> ignore_index) {
  return ignore_index && target == *ignore_index;
}

// The CPU's forward: per-sample loss -(1-s) * logp[t] - (s/C) * sum_j logp[j],
// 0 for an ignored sample; saves the probabilities and the targets for backward.
LossForward cross_entropy_cpu(const Tensor& x, const Tensor& t, double smoothing,
                              Reduction reduction, std::optional<int64_t> ignore_index) {
  const int64_t n = x.shape()[0], c = x.shape()[1];
  const int64_t* tp = t.data_ptr<int64_t>();
  // The hint for a negative target: pass ignore_index, or, when one was
  // passed, that it is another value (nanoGPT's -1 beside PyTorch's -100).
  const std::string skip_hint =
      ignore_index ? fmt::format("; only targets equal to ignore_index = {} are skipped",
                                 *ignore_index)
                   : "; to skip such samples (PyTorch skips -100 by default), pass ignore_index";
  for (int64_t i = 0; i < n; ++i)
    LOCKSTEP_CHECK((tp[i] >= 0 && tp[i] < c) || is_ignored(tp[i], ignore_index),
                   "cross_entropy: target[{}] = {} is not a class index in [0, {}){}", i, tp[i], c,
                   tp[i] < 0 ? skip_hint : std::string());
  Tensor probs = Tensor::empty({n, c}, x.dtype());
  Tensor losses = Tensor::empty({n}, x.dtype());
  dispatch_float(x.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.data_ptr<T>();
    T* pp = probs.data_ptr<T>();
    T* lp = losses.data_ptr<T>();
    const T s = static_cast<T>(smoothing);
    for (int64_t i = 0; i < n; ++i) {
      const T* row = xp + i * c;
      T* prow = pp + i * c;
      const T mx = cpu::row_max(row, c);
      const T se = cpu::exp_shifted(row, prow, c, mx);
      // Logits are taken relative to the row's maximum, as log_softmax's
      // (x - max) - log(sum): max + log(sum) would round log(sum) away once
      // |max| is large (a loss of 0 for equal logits of 1e8 in f32).
      T sum_shifted = 0;
      for (int64_t j = 0; j < c; ++j) sum_shifted += row[j] - mx;
      const T log_sum = std::log(se);
      for (int64_t j = 0; j < c; ++j) prow[j] /= se;
      if (is_ignored(tp[i], ignore_index)) {  // whatever its logits: no 0 * inf
        lp[i] = 0;
        continue;
      }
      const T nll = (mx - row[tp[i]]) + log_sum;
      const T smooth = log_sum - sum_shifted / static_cast<T>(c);  // mean over classes of -logp
      // Without smoothing, a -inf logit (an infinite smooth) must not give 0 * inf.
      lp[i] = s > 0 ? (1 - s) * nll + s * smooth : nll;
    }
  });
  Tensor out = reduce(losses, reduction);
  // The reduction is part of the loss's node so backward is one fused pass.
  if (reduction != Reduction::None) out = out.detach();
  return {out, {probs, t}};
}

Tensor cross_entropy_backward_cpu(const std::vector<Tensor>& saved, const Tensor& grad,
                                  double smoothing, Reduction reduction,
                                  std::optional<int64_t> ignore_index) {
  const Tensor &probs = saved[0], &t = saved[1];
  const int64_t n = probs.shape()[0], c = probs.shape()[1];
  Tensor gy = grad.to(probs.dtype()).contiguous();
  Tensor gx = Tensor::empty({n, c}, probs.dtype());
  dispatch_float(probs.dtype(), "cross_entropy backward", [&](auto tag) {
    using T = decltype(tag);
    const T* pp = probs.data_ptr<T>();
    const T* gp = gy.data_ptr<T>();
    const int64_t* tp = t.data_ptr<int64_t>();
    T* op = gx.data_ptr<T>();
    const T s = static_cast<T>(smoothing), off = s / static_cast<T>(c);
    for (int64_t i = 0; i < n; ++i) {
      if (is_ignored(tp[i], ignore_index)) {
        std::fill(op + i * c, op + (i + 1) * c, T(0));
        continue;
      }
      T w = reduction == Reduction::None ? gp[i] : gp[0];
      if (reduction == Reduction::Mean) w /= static_cast<T>(n);
      for (int64_t j = 0; j < c; ++j) op[i * c + j] = w * (pp[i * c + j] - off);
      op[i * c + tp[i]] -= w * (1 - s);
    }
  });
  return gx;
}

// No samples (the empty batch of a rank that has joined, nn::Join): the loss
// is 0 for Mean as for Sum (PyTorch's mean over nothing is NaN, which would
// poison a running loss), [0] for None; the gradient is empty, so only zeros
// reach the parameters. No kernel runs, on any device.
Tensor empty_cross_entropy(const Tensor& logits, Reduction reduction) {
  Tensor out = reduction == Reduction::None
                   ? Tensor::empty({0}, logits.dtype(), logits.device())
                   : Tensor::zeros({}, logits.dtype(), logits.device());
  const Shape shape = logits.shape();
  const DType dtype = logits.dtype();
  const Device device = logits.device();
  return record(out, "CrossEntropyBackward", {logits}, {}, [=](const BackwardArgs&) {
    return std::vector<Tensor>{Tensor::empty(shape, dtype, device)};
  });
}

void check_target_dtype(const Tensor& target) {
  LOCKSTEP_CHECK(target.dtype() == DType::i64 || target.dtype() == DType::i32,
                 "cross_entropy: target must hold class indices (i64 or i32), got {}",
                 dtype_name(target.dtype()));
}

// ignore_index with Sum or Mean: the per-sample losses (those ignored exactly
// 0) summed in f32 (f64 for f64) and, for Mean, divided by the samples kept
// (0 when none is), then rounded to the losses' dtype once: 16-bit losses
// would overflow or round a count past 65504 or 256.
Tensor reduce_kept(const Tensor& losses, const Tensor& target, int64_t ignore_index,
                   Reduction reduction) {
  const DType acc = losses.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor total = sum(losses.to(acc));
  if (reduction == Reduction::Sum) return total.to(losses.dtype());
  const Tensor t = target.to(DType::i64);
  const Tensor ignored = eq(t, Tensor::empty({}, DType::i64, t.device()).fill_(ignore_index));
  const Tensor count = sum(add(neg(ignored.to(acc)), 1.0));
  const Tensor none_kept = eq(count, Tensor::zeros({}, acc, count.device())).to(acc);
  return div(total, add(count, none_kept)).to(losses.dtype());
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& target, double smoothing,
                     Reduction reduction, std::optional<int64_t> ignore_index) {
  if (target.shape() == logits.shape()) {
    return detail::probability_cross_entropy(logits, target, Tensor(), smoothing, reduction,
                                             ignore_index);
  }
  if (logits.dim() > 2) {
    const detail::ClassRows r = detail::class_rows(logits, target, "cross_entropy");
    const Tensor loss = cross_entropy(r.input, r.target, smoothing, reduction, ignore_index);
    return reduction == Reduction::None ? loss.reshape(target.shape()) : loss;
  }
  if (ignore_index && reduction != Reduction::None) {  // the rows' losses, reduced here
    return reduce_kept(cross_entropy(logits, target, smoothing, Reduction::None, ignore_index),
                       target, *ignore_index, reduction);
  }
  if (auto c = detail::autocast_inputs(detail::CastPolicy::f32, {logits}))
    return cross_entropy((*c)[0], target, smoothing, reduction, ignore_index);
  if (auto low = detail::cpu_reduced_dtype({logits}))
    return detail::in_f32(*low, {logits}, [&](const auto& in) {
      return cross_entropy(in[0], target, smoothing, reduction, ignore_index);
    });
  LOCKSTEP_CHECK(logits.dim() == 2,
                 "cross_entropy: logits must be [N, C] or [N, C, d1, ...], got {}",
                 shape_str(logits.shape()));
  LOCKSTEP_CHECK(target.dim() == 1 && target.shape()[0] == logits.shape()[0],
                 "cross_entropy: target must be [N] = [{}] class indices, got {}",
                 logits.shape()[0], shape_str(target.shape()));
  check_target_dtype(target);
  LOCKSTEP_CHECK(smoothing >= 0.0 && smoothing <= 1.0,
                 "cross_entropy: label_smoothing must be in [0, 1], got {}", smoothing);
  LOCKSTEP_CHECK(logits.device() == target.device(),
                 "cross_entropy: logits are on {} and target on {}; both must be on one device",
                 logits.device().str(), target.device().str());
  if (logits.shape()[0] == 0) return empty_cross_entropy(logits, reduction);
  const Tensor x = logits.contiguous();
  const Tensor t = target.to(DType::i64).contiguous();
  const LossForward f = x.device().is_cpu()
                            ? cross_entropy_cpu(x, t, smoothing, reduction, ignore_index)
                            : device_backend(x.device())
                                  .cross_entropy_forward(x, t, smoothing, reduction, ignore_index);
  return record(f.out, "CrossEntropyBackward", {logits}, f.saved,
                [smoothing, reduction, ignore_index](const BackwardArgs& g) {
                  const Device device = g.saved[0].device();
                  return std::vector<Tensor>{
                      device.is_cpu()
                          ? cross_entropy_backward_cpu(g.saved, g.grad, smoothing, reduction,
                                                       ignore_index)
                          : device_backend(device).cross_entropy_backward(
                                g.saved, g.grad, smoothing, reduction, ignore_index)};
                });
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  if (auto c = detail::autocast_inputs(detail::CastPolicy::f32, {input, target}))
    return mse_loss((*c)[0], (*c)[1], reduction);
  LOCKSTEP_CHECK(input.shape() == target.shape(),
                 "mse_loss: input {} and target {} must have the same shape",
                 shape_str(input.shape()), shape_str(target.shape()));
  Tensor diff = sub(input, target);
  // Over no elements, Mean is 0 as for cross_entropy, not NaN.
  if (reduction == Reduction::Mean && diff.numel() == 0) return sum(mul(diff, diff));
  return reduce(mul(diff, diff), reduction);
}

}  // namespace lockstep::runtime
