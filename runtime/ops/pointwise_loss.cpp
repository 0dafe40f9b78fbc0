// The elementwise losses of pointwise_loss.h, built from the differentiable
// elementwise ops (so they run wherever those do). binary_cross_entropy alone
// records a node of its own, for PyTorch's clamped gradient, which the ops'
// chain rule would turn into 0 * inf = NaN at an input of exactly 0 or 1.
#include "lockstep/runtime/ops/pointwise_loss.h"

#include <string>

#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops/activation.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/reduce.h"

namespace lockstep::runtime {

namespace {

// Mean over no elements is 0 (the sum of nothing), as mse_loss's.
Tensor reduce(const Tensor& losses, Reduction r) {
  switch (r) {
    case Reduction::Mean: return losses.numel() == 0 ? sum(losses) : mean(losses);
    case Reduction::Sum: return sum(losses);
    case Reduction::None: return losses;
  }
  return losses;
}

void check_pair(const char* loss, const Tensor& input, const Tensor& target) {
  LOCKSTEP_CHECK(input.shape() == target.shape(),
                 "{}: input {} and target {} must have the same shape", loss,
                 shape_str(input.shape()), shape_str(target.shape()));
  LOCKSTEP_CHECK(is_floating(input.dtype()) && input.dtype() == target.dtype(),
                 "{}: input ({}) and target ({}) must be of one floating dtype; convert the "
                 "target with .to(input.dtype())",
                 loss, dtype_name(input.dtype()), dtype_name(target.dtype()));
  LOCKSTEP_CHECK(input.device() == target.device(),
                 "{}: input is on {} and target on {}; both must be on one device", loss,
                 input.device().str(), target.device().str());
}

// A weight (or pos_weight) must broadcast to the input's shape without
// growing it, be of the input's dtype and on its device.
void check_weight(const char* loss, const char* name, const std::optional<Tensor>& w,
                  const Tensor& input) {
  if (!w) return;
  LOCKSTEP_CHECK(w->dtype() == input.dtype() && w->device() == input.device(),
                 "{}: {} ({} on {}) must be of the input's dtype and device ({} on {})", loss,
                 name, dtype_name(w->dtype()), w->device().str(), dtype_name(input.dtype()),
                 input.device().str());
  bool fits = false;
  try {
    fits = broadcast_shapes(w->shape(), input.shape()) == input.shape();
  } catch (const Error&) {  // not broadcastable at all: said below, with the names
  }
  LOCKSTEP_CHECK(fits, "{}: {} {} does not broadcast to the input's shape {}", loss, name,
                 shape_str(w->shape()), shape_str(input.shape()));
}

Tensor scalar_like(const Tensor& t, double v) {
  return Tensor::full({}, v, t.dtype(), t.device());
}

// max(log(x), -100), as PyTorch clamps BCE's logs. Shifting by 100 and back
// (relu(log x + 100) - 100) would round log x to the ulp of 100 (8e-6 in f32,
// 0.5 in bf16) and lose every small loss; instead, where log x < -100 (x = 0
// included) the log is taken of x + 1 = 1, and -100 added: exact everywhere.
Tensor clamped_log(const Tensor& x) {
  const Tensor below = gt(scalar_like(x, -100.0), log(x)).to(x.dtype());
  return add(log(add(x, below)), mul(below, -100.0));
}

// max(v, eps) exactly: v where v >= eps, else eps (both finite).
Tensor clamp_min(const Tensor& v, double eps) {
  const Tensor below = gt(scalar_like(v, eps), v).to(v.dtype());
  return add(mul(v, add(neg(below), 1.0)), mul(below, eps));
}

}  // namespace

Tensor binary_cross_entropy(const Tensor& input, const Tensor& target, const BceOptions& o) {
  if (auto c = detail::autocast_inputs(detail::CastPolicy::f32, {input, target})) {
    BceOptions cast = o;
    if (cast.weight) cast.weight = cast.weight->to(DType::f32);
    return binary_cross_entropy((*c)[0], (*c)[1], cast);
  }
  check_pair("binary_cross_entropy", input, target);
  check_weight("binary_cross_entropy", "weight", o.weight, input);
  const Tensor x = input.detach(), y = target.detach();
  Tensor losses;
  {
    NoGradGuard no_grad;
    // NaN fails both comparisons, as in PyTorch's check (x != x counts it).
    // One number read back, so one wait on a device.
    const Tensor above = gt(x, scalar_like(x, 1.0)).to(DType::f64);
    const Tensor below = gt(scalar_like(x, 0.0), x).to(DType::f64);
    const Tensor nan = add(neg(eq(x, x).to(DType::f64)), 1.0);
    const auto outside = static_cast<int64_t>(sum(add(add(above, below), nan)).item());
    LOCKSTEP_CHECK(outside == 0,
                   "binary_cross_entropy: all elements of input should be between 0 and 1, but "
                   "{} are not (or are NaN); pass probabilities (e.g. sigmoid(logits)), or pass "
                   "the logits to binary_cross_entropy_with_logits",
                   outside);
    const Tensor one_minus_y = add(neg(y), 1.0);
    losses = neg(add(mul(y, clamped_log(x)), mul(one_minus_y, clamped_log(add(neg(x), 1.0)))));
  }
  // The loss is linear in the weight, so the weight's gradient is the
  // unweighted loss (summed over what the weight was broadcast along).
  const Tensor unweighted = losses;
  std::vector<Tensor> inputs = {input, target}, saved = {x, y};
  if (o.weight) {
    NoGradGuard no_grad;
    losses = mul(losses, *o.weight);
    inputs.push_back(*o.weight);
    saved.push_back(o.weight->detach());
    // Kept for backward only where the weight's gradient is wanted.
    if (o.weight->requires_grad()) saved.push_back(unweighted);
  }
  losses = record(losses, "BinaryCrossEntropyBackward", inputs, saved,
                  [](const BackwardArgs& g) {
                    const Tensor &x = g.saved[0], &y = g.saved[1];
                    const bool weighted = g.saved.size() > 2;
                    Tensor gw = weighted ? mul(g.grad, g.saved[2]) : g.grad;
                    Tensor gx, gy;
                    if (g.needs[0]) {
                      // w (x - y) / max(x (1 - x), 1e-12), PyTorch's clamp.
                      const Tensor var = mul(x, add(neg(x), 1.0));
                      gx = div(mul(gw, sub(x, y)), clamp_min(var, 1e-12));
                    }
                    if (g.needs[1])  // d/dy of -[y log x + (1-y) log(1-x)], logs clamped
                      gy = mul(gw, sub(clamped_log(add(neg(x), 1.0)), clamped_log(x)));
                    std::vector<Tensor> grads = {gx, gy};
                    if (weighted) grads.emplace_back();
                    if (g.saved.size() > 3 && g.needs[2])
                      grads[2] = sum_to(mul(g.grad, g.saved[3]), g.saved[2].shape());
                    return grads;
                  });
  return reduce(losses, o.reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        const BceWithLogitsOptions& o) {
  if (auto c = detail::autocast_inputs(detail::CastPolicy::f32, {input, target})) {
    BceWithLogitsOptions cast = o;
    if (cast.weight) cast.weight = cast.weight->to(DType::f32);
    if (cast.pos_weight) cast.pos_weight = cast.pos_weight->to(DType::f32);
    return binary_cross_entropy_with_logits((*c)[0], (*c)[1], cast);
  }
  const char* name = "binary_cross_entropy_with_logits";
  check_pair(name, input, target);
  check_weight(name, "weight", o.weight, input);
  check_weight(name, "pos_weight", o.pos_weight, input);
  const Tensor& x = input;
  const Tensor& y = target;
  // log(1 + exp(-x)) = log(exp(-m) + exp(-x - m)) + m with m = max(-x, 0):
  // neither exp overflows. Its gradient w.r.t. m is exactly 0, so relu's
  // choice at x = 0 does not matter.
  const Tensor m = relu(neg(x));
  const Tensor softplus_neg =
      add(log(add(exp(neg(m)), exp(sub(neg(x), m)))), m);  // -log sigmoid(x)
  Tensor losses;
  if (o.pos_weight) {
    const Tensor log_weight = add(mul(add(*o.pos_weight, -1.0), y), 1.0);
    losses = add(mul(add(neg(y), 1.0), x), mul(log_weight, softplus_neg));
  } else {
    losses = add(mul(add(neg(y), 1.0), x), softplus_neg);
  }
  if (o.weight) losses = mul(losses, *o.weight);
  return reduce(losses, o.reduction);
}

Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  if (auto c = detail::autocast_inputs(detail::CastPolicy::f32, {input, target}))
    return l1_loss((*c)[0], (*c)[1], reduction);
  check_pair("l1_loss", input, target);
  return reduce(abs(sub(input, target)), reduction);
}

namespace {

// With a = |d| and c = min(a, k) = a - relu(a - k): 0.5 c^2 + k (a - c) is
// 0.5 d^2 inside |d| <= k and k (|d| - 0.5 k) outside, the Huber loss; its
// gradient is d inside and k sign(d) outside (relu' = 0 at the border, where
// both agree).
Tensor huber(const Tensor& input, const Tensor& target, double k) {
  const Tensor a = abs(sub(input, target));
  const Tensor excess = relu(add(a, -k));
  const Tensor c = sub(a, excess);
  return add(mul(mul(c, c), 0.5), mul(excess, k));
}

}  // namespace

Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, Reduction reduction,
                      double beta) {
  if (auto c = detail::autocast_inputs(detail::CastPolicy::f32, {input, target}))
    return smooth_l1_loss((*c)[0], (*c)[1], reduction, beta);
  LOCKSTEP_CHECK(beta >= 0, "smooth_l1_loss: beta must be >= 0 (0 is l1_loss), got {}", beta);
  if (beta == 0) return l1_loss(input, target, reduction);
  check_pair("smooth_l1_loss", input, target);
  return reduce(mul(huber(input, target, beta), 1.0 / beta), reduction);
}

Tensor huber_loss(const Tensor& input, const Tensor& target, Reduction reduction, double delta) {
  if (auto c = detail::autocast_inputs(detail::CastPolicy::f32, {input, target}))
    return huber_loss((*c)[0], (*c)[1], reduction, delta);
  LOCKSTEP_CHECK(delta > 0, "huber_loss: delta must be > 0, got {}", delta);
  check_pair("huber_loss", input, target);
  return reduce(huber(input, target, delta), reduction);
}

Tensor kl_div(const Tensor& input, const Tensor& target, KlDivReduction reduction,
              bool log_target) {
  if (auto c = detail::autocast_inputs(detail::CastPolicy::f32, {input, target}))
    return kl_div((*c)[0], (*c)[1], reduction, log_target);
  check_pair("kl_div", input, target);
  LOCKSTEP_CHECK(reduction != KlDivReduction::BatchMean || input.dim() >= 1,
                 "kl_div: BatchMean divides by the batch size, input.shape()[0], but the input "
                 "is a scalar; use Sum or Mean");
  Tensor losses;
  if (log_target) {
    losses = mul(exp(target), sub(target, input));
  } else {
    // xlogy(t, t) = t log t, 0 at t = 0: log(t + [t == 0]) is log t elsewhere
    // (exactly: the added 0 changes nothing) and 0 there, so no 0 * -inf.
    const Tensor at_zero = eq(target, scalar_like(target, 0.0)).to(target.dtype());
    losses = sub(mul(target, log(add(target, at_zero))), mul(target, input));
  }
  switch (reduction) {
    case KlDivReduction::Mean: return reduce(losses, Reduction::Mean);
    case KlDivReduction::Sum: return sum(losses);
    case KlDivReduction::None: return losses;
    case KlDivReduction::BatchMean: {
      const int64_t batch = input.shape()[0];
      const Tensor total = sum(losses);
      return batch == 0 ? total : div(total, scalar_like(total, static_cast<double>(batch)));
    }
  }
  return losses;
}

}  // namespace lockstep::runtime
