// nll_loss from differentiable ops: the picked log-probabilities and the
// class weights are gathered with embedding (whose backward scatters the
// gradient into the picked entries), so it runs wherever embedding does.
#include "lockstep/runtime/ops/nll_loss.h"

#include <string>
#include <vector>

#include <fmt/format.h>

#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/misc.h"
#include "lockstep/runtime/ops/reduce.h"

namespace lockstep::runtime {

namespace {

void check_args(const Tensor& input, const Tensor& target, const NllOptions& o) {
  LOCKSTEP_CHECK(input.dim() == 2 && is_floating(input.dtype()),
                 "nll_loss: input must be [N, C] floating log-probabilities, got {} {}",
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

Tensor nll_loss(const Tensor& input, const Tensor& target, const NllOptions& o) {
  if (auto c = detail::autocast_inputs(detail::CastPolicy::f32, {input})) {
    NllOptions cast = o;
    if (cast.weight) cast.weight = cast.weight->to(DType::f32);
    return nll_loss((*c)[0], target, cast);
  }
  check_args(input, target, o);
  const int64_t n = input.shape()[0], c = input.shape()[1];
  // Per sample: the flat index of its picked entry, its class (0 for an
  // ignored one, whose weight is then 0) and whether it is kept.
  const std::vector<int64_t> t = target.to(Device::cpu()).to(DType::i64).to_vector<int64_t>();
  std::vector<int64_t> flat(n), cls(n);
  std::vector<double> kept(n);
  for (int64_t i = 0; i < n; ++i) {
    const bool ignored = o.ignore_index && t[i] == *o.ignore_index;
    LOCKSTEP_CHECK(ignored || (t[i] >= 0 && t[i] < c),
                   "nll_loss: target[{}] = {} is not a class index in [0, {}){}", i, t[i], c,
                   t[i] >= 0 ? ""
                   : o.ignore_index
                       ? fmt::format("; only targets equal to ignore_index = {} are skipped",
                                     *o.ignore_index)
                       : "; to skip such samples (PyTorch skips -100 by default), pass "
                         "ignore_index");
    cls[i] = ignored ? 0 : t[i];
    flat[i] = i * c + cls[i];
    kept[i] = ignored ? 0.0 : 1.0;
  }
  const Device dev = input.device();
  const Tensor picked =
      embedding(Tensor::from_vector<int64_t>(flat, {n}).to(dev), input.reshape({n * c, 1}))
          .reshape({n});
  Tensor w = Tensor::from_vector<double>(kept, {n}).to(input.dtype()).to(dev);
  if (o.weight)
    w = mul(w, embedding(Tensor::from_vector<int64_t>(cls, {n}).to(dev),
                         o.weight->reshape({c, 1}))
                   .reshape({n}));
  const Tensor losses = neg(mul(picked, w));
  if (o.reduction == Reduction::None) return losses;
  // Summed in f32 (f64 for f64) and rounded once, as cross_entropy's.
  const DType acc = input.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor total = sum(losses.to(acc));
  if (o.reduction == Reduction::Sum) return total.to(input.dtype());
  const Tensor denom = sum(w.to(acc));
  const Tensor zero_denom = eq(denom, Tensor::zeros({}, acc, dev)).to(acc);
  return div(total, add(denom, zero_denom)).to(input.dtype());
}

}  // namespace lockstep::runtime
