// nll_loss from differentiable ops: the picked log-probabilities and the
// class weights are gathered with embedding (whose backward scatters the
// gradient into the picked entries), so it runs wherever embedding does.
#include "lockstep/runtime/ops/nll_loss.h"

#include <string>
#include <vector>

#include <fmt/format.h>

#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/ops/activation.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops/detail/class_rows.h"
#include "lockstep/runtime/ops/detail/soft_targets.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/misc.h"
#include "lockstep/runtime/ops/reduce.h"

namespace lockstep::runtime {

namespace {

void check_args(const Tensor& input, const Tensor& target, const NllOptions& o) {
  LOCKSTEP_CHECK(input.dim() == 2 && is_floating(input.dtype()),
                 "nll_loss: input must be [N, C] or [N, C, d1, ...] floating log-probabilities, "
                 "got {} {}",
                 shape_str(input.shape()), dtype_name(input.dtype()));
  LOCKSTEP_CHECK(target.dim() == 1 && target.shape()[0] == input.shape()[0],
                 "nll_loss: target must be [N] = [{}] class indices, got {}", input.shape()[0],
                 shape_str(target.shape()));
  LOCKSTEP_CHECK(target.dtype() == DType::i64 || target.dtype() == DType::i32,
                 "nll_loss: target must hold class indices (i64 or i32), got {}",
                 dtype_name(target.dtype()));
  LOCKSTEP_CHECK(input.device() == target.device(),
                 "nll_loss: input is on {} and target on {}; both must be on one device",
                 input.device().str(), target.device().str());
  if (!o.weight) return;
  const int64_t c = input.shape()[1];
  LOCKSTEP_CHECK(o.weight->dim() == 1 && o.weight->shape()[0] == c,
                 "nll_loss: weight must be [C] = [{}], one per class, got {}", c,
                 shape_str(o.weight->shape()));
  LOCKSTEP_CHECK(o.weight->dtype() == input.dtype() && o.weight->device() == input.device(),
                 "nll_loss: weight ({} on {}) must be of the input's dtype and device ({} on {})",
                 dtype_name(o.weight->dtype()), o.weight->device().str(),
                 dtype_name(input.dtype()), input.device().str());
}

}  // namespace

namespace {

// Per sample of target: the flat index of its picked input entry, i * C + t;
// its row in [v, 0] (i when kept, N when ignored), to read a per-sample
// value as 0 for an ignored sample without multiplying by a mask (which
// would make NaN of an ignored row's -inf); and its weight, kept * weight[t],
// which the weighted Mean divides by. Ignored samples pick class 0.
struct Picks {
  Tensor flat;      // i64 [N]
  Tensor row;       // i64 [N]
  Tensor class_w;   // [N] weight[t], or undefined without a weight
  Tensor weighted;  // [N] kept * weight[t] (kept alone without a weight)
};

Picks pick(const Tensor& input, const Tensor& target, const NllOptions& o, const char* loss) {
  const int64_t n = input.shape()[0], c = input.shape()[1];
  const std::vector<int64_t> t = target.to(Device::cpu()).to(DType::i64).to_vector<int64_t>();
  std::vector<int64_t> flat(n), row(n), cls(n);
  std::vector<double> kept(n);
  for (int64_t i = 0; i < n; ++i) {
    const bool ignored = o.ignore_index && t[i] == *o.ignore_index;
    LOCKSTEP_CHECK(ignored || (t[i] >= 0 && t[i] < c),
                   "{}: target[{}] = {} is not a class index in [0, {}){}", loss, i, t[i], c,
                   t[i] >= 0 ? ""
                   : o.ignore_index
                       ? fmt::format("; only targets equal to ignore_index = {} are skipped",
                                     *o.ignore_index)
                       : "; to skip such samples (PyTorch skips -100 by default), pass "
                         "ignore_index");
    cls[i] = ignored ? 0 : t[i];
    flat[i] = i * c + cls[i];
    row[i] = ignored ? n : i;
    kept[i] = ignored ? 0.0 : 1.0;
  }
  const Device dev = input.device();
  Picks p;
  p.flat = Tensor::from_vector<int64_t>(flat, {n}).to(dev);
  p.row = Tensor::from_vector<int64_t>(row, {n}).to(dev);
  p.weighted = Tensor::from_vector<double>(kept, {n}).to(input.dtype()).to(dev);
  if (o.weight) {
    p.class_w = embedding(Tensor::from_vector<int64_t>(cls, {n}).to(dev),
                          o.weight->reshape({c, 1}))
                    .reshape({n});
    p.weighted = mul(p.weighted, p.class_w);
  }
  return p;
}

// v [N] with the ignored samples' entries read as exactly 0.
Tensor zero_ignored(const Tensor& v, const Picks& p) {
  const int64_t n = v.shape()[0];
  const Tensor padded = cat({v, Tensor::zeros({1}, v.dtype(), v.device())});
  return embedding(p.row, padded.reshape({n + 1, 1})).reshape({n});
}

// -weight[t] * input[i, t] per sample, 0 for an ignored one.
Tensor picked_losses(const Tensor& input, const Picks& p) {
  const int64_t n = input.shape()[0], c = input.shape()[1];
  Tensor picked = embedding(p.flat, input.reshape({n * c, 1})).reshape({n});
  if (p.class_w.defined()) picked = mul(picked, p.class_w);
  return zero_ignored(neg(picked), p);
}

// Sum, or Mean as the sum over the kept samples' weights summed (0 when that
// is 0), in f32 (f64 for f64) and rounded once, as cross_entropy's.
Tensor reduce_weighted(const Tensor& losses, const Tensor& weighted, Reduction reduction) {
  if (reduction == Reduction::None) return losses;
  const DType acc = losses.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor total = sum(losses.to(acc));
  if (reduction == Reduction::Sum) return total.to(losses.dtype());
  const Tensor denom = sum(weighted.to(acc));
  const Tensor zero_denom = eq(denom, Tensor::zeros({}, acc, denom.device())).to(acc);
  return div(total, add(denom, zero_denom)).to(losses.dtype());
}

}  // namespace

Tensor nll_loss(const Tensor& input, const Tensor& target, const NllOptions& o) {
  if (input.dim() > 2) {
    const detail::ClassRows r = detail::class_rows(input, target, "nll_loss");
    const Tensor loss = nll_loss(r.input, r.target, o);
    return o.reduction == Reduction::None ? loss.reshape(target.shape()) : loss;
  }
  if (auto c = detail::autocast_inputs(detail::CastPolicy::f32, {input})) {
    NllOptions cast = o;
    if (cast.weight) cast.weight = cast.weight->to(DType::f32);
    return nll_loss((*c)[0], target, cast);
  }
  check_args(input, target, o);
  const Picks p = pick(input, target, o, "nll_loss");
  return reduce_weighted(picked_losses(input, p), p.weighted, o.reduction);
}

namespace detail {

// Per sample (and position) -sum_c w[c] q[c] logp[c], with q the target
// probabilities, smoothed to (1-s) q + s/C, and logp = log_softmax(logits, 1);
// Mean divides by the number of samples and positions, not by the weights,
// as PyTorch 1.13. Over none, Mean is 0, as for class indices.
Tensor probability_cross_entropy(const Tensor& logits, const Tensor& probs, const Tensor& weight,
                                 double smoothing, Reduction reduction,
                                 std::optional<int64_t> ignore_index) {
  LOCKSTEP_CHECK(logits.dim() >= 2,
                 "cross_entropy: logits must be [N, C] or [N, C, d1, ...], got {}",
                 shape_str(logits.shape()));
  LOCKSTEP_CHECK(is_floating(probs.dtype()),
                 "cross_entropy: a target of the logits' shape {} holds class probabilities "
                 "and must be floating, got {}; for class indices give a target [N, d1, ...]",
                 shape_str(logits.shape()), dtype_name(probs.dtype()));
  LOCKSTEP_CHECK(!ignore_index || *ignore_index < 0,
                 "cross_entropy: ignore_index ({}) is not supported with class-probability "
                 "targets; give a weight of 0 to the samples' probabilities instead",
                 ignore_index.value_or(0));
  LOCKSTEP_CHECK(smoothing >= 0.0 && smoothing <= 1.0,
                 "cross_entropy: label_smoothing must be in [0, 1], got {}", smoothing);
  LOCKSTEP_CHECK(logits.device() == probs.device(),
                 "cross_entropy: logits are on {} and target on {}; both must be on one device",
                 logits.device().str(), probs.device().str());
  const Tensor logp = log_softmax(logits, 1);  // in f32 under autocast
  const int64_t c = logits.shape()[1];
  Tensor q = probs.to(logp.dtype());
  if (smoothing > 0.0) q = add(mul(q, 1.0 - smoothing), smoothing / static_cast<double>(c));
  Tensor terms = mul(q, logp);
  if (weight.defined()) {
    LOCKSTEP_CHECK(weight.dim() == 1 && weight.shape()[0] == c,
                   "cross_entropy: weight must be [C] = [{}], one per class, got {}", c,
                   shape_str(weight.shape()));
    Shape per_class(logits.dim(), 1);
    per_class[1] = c;
    terms = mul(terms, weight.to(logp.dtype()).reshape(per_class));
  }
  const Tensor losses = neg(sum(terms, {1}));
  if (reduction == Reduction::None) return losses;
  const DType acc = losses.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor total = sum(losses.to(acc));
  if (reduction == Reduction::Sum || losses.numel() == 0) return total.to(losses.dtype());
  return mul(total, 1.0 / static_cast<double>(losses.numel())).to(losses.dtype());
}

}  // namespace detail

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight,
                     double smoothing, Reduction reduction, std::optional<int64_t> ignore_index) {
  LOCKSTEP_CHECK(weight.defined(),
                 "cross_entropy: the class weight is an undefined tensor; call cross_entropy "
                 "without it for no weight");
  if (target.shape() == logits.shape()) {
    return detail::probability_cross_entropy(logits, target, weight, smoothing, reduction,
                                             ignore_index);
  }
  if (logits.dim() > 2) {
    const detail::ClassRows r = detail::class_rows(logits, target, "cross_entropy");
    const Tensor loss =
        cross_entropy(r.input, r.target, weight, smoothing, reduction, ignore_index);
    return reduction == Reduction::None ? loss.reshape(target.shape()) : loss;
  }
  LOCKSTEP_CHECK(logits.dim() == 2,
                 "cross_entropy: logits must be [N, C] or [N, C, d1, ...], got {}",
                 shape_str(logits.shape()));
  LOCKSTEP_CHECK(smoothing >= 0.0 && smoothing <= 1.0,
                 "cross_entropy: label_smoothing must be in [0, 1], got {}", smoothing);
  const Tensor logp = log_softmax(logits, 1);  // in f32 under autocast, as cross_entropy
  const NllOptions o{.weight = weight.to(logp.dtype()), .ignore_index = ignore_index};
  check_args(logp, target, o);
  const Picks p = pick(logp, target, o, "cross_entropy");
  Tensor losses = picked_losses(logp, p);
  if (smoothing > 0.0) {
    // -sum_j w[j] logp[j] per kept sample, as PyTorch's smooth_loss.
    const Tensor smooth = zero_ignored(neg(sum(mul(logp, *o.weight), {1})), p);
    const double c = static_cast<double>(logp.shape()[1]);
    losses = add(mul(losses, 1.0 - smoothing), mul(smooth, smoothing / c));
  }
  return reduce_weighted(losses, p.weighted, reduction);
}

}  // namespace lockstep::runtime
