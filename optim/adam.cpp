#include "lockstep/optim/adam.h"

#include <cmath>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "lockstep/optim/update_helpers.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/error.h"

#include "lockstep/runtime/ops/fused_step.h"

namespace lockstep::optim {

using runtime::NoGradGuard;

namespace {

using detail::with_flag;

// Coefficients worked out in double once per step, then rounded to the
// compute type, as PyTorch passes Python floats to its CPU kernels.
template <class C>
struct Coeffs {
  C decay;            // AdamW: 1 - lr * weight_decay
  C weight_decay;     // Adam: L2 term added to the gradient
  C beta1, one_minus_beta1, beta2, one_minus_beta2;
  C bias_correction2_sqrt, eps, neg_step_size;
};

// One pass over a parameter, adam.h's rule fused per element, each line in
// the order of PyTorch's single-tensor ops (mul_ then add_, addcmul_,
// sqrt / c + eps, addcdiv_) so f32 and f64 results follow the same
// roundings. Arithmetic is in C = compute_t<T>: bf16 and f16 values are
// loaded into float and rounded once when stored, as PyTorch's fused kernels
// do.
template <class T, bool kL2, bool kDecoupled, bool kAmsgrad, bool kMaximize>
void adam_update(T* __restrict__ p, const T* __restrict__ grad, T* __restrict__ m,
                 T* __restrict__ v, T* __restrict__ vmax, int64_t n,
                 const Coeffs<runtime::compute_t<T>>& c) {
  using C = runtime::compute_t<T>;
  for (int64_t i = 0; i < n; ++i) {
    C g = static_cast<C>(grad[i]);
    if constexpr (kMaximize) g = -g;
    C pi = static_cast<C>(p[i]);
    if constexpr (kDecoupled) pi = pi * c.decay;
    if constexpr (kL2) g = g + c.weight_decay * pi;
    const C mi = static_cast<C>(m[i]) * c.beta1 + c.one_minus_beta1 * g;
    const C vi = static_cast<C>(v[i]) * c.beta2 + c.one_minus_beta2 * g * g;
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
    C second = vi;
    if constexpr (kAmsgrad) {
      // torch.maximum: NaN when either is (a plain max keeps or drops it by
      // the order of the operands).
      const C old = static_cast<C>(vmax[i]);
      second = old < vi || std::isnan(vi) ? vi : old;
      vmax[i] = static_cast<T>(second);
    }
    const C denom = std::sqrt(second) / c.bias_correction2_sqrt + c.eps;
    p[i] = static_cast<T>(pi + c.neg_step_size * mi / denom);
  }
}

template <class T>
void adam_dispatch(T* p, const T* grad, T* m, T* v, T* vmax, int64_t n,
                   const Coeffs<runtime::compute_t<T>>& c,
                   bool l2, bool decoupled, bool amsgrad, bool maximize) {
  with_flag(l2, [&](auto l2f) {
    with_flag(decoupled, [&](auto dec) {
      with_flag(amsgrad, [&](auto ams) {
        with_flag(maximize, [&](auto max) {
          adam_update<T, decltype(l2f)::value, decltype(dec)::value, decltype(ams)::value,
                      decltype(max)::value>(p, grad, m, v, vmax, n, c);
        });
      });
    });
  });
}

// The state tensor `key` of a parameter, made contiguous; zero-filled when
// the parameter has none yet. The caller keeps it in the state.
Tensor state_tensor(const std::map<std::string, Tensor>& st, const char* key, const Tensor& param) {
  const Tensor* saved = detail::find_entry(&st, key);
  return saved == nullptr ? Tensor::zeros(param.shape(), param.dtype(), param.device())
                          : saved->contiguous();
}

// Counts a step of the parameter whose state is `st`: "step" as PyTorch
// keeps it, a 0-dim f32 tensor (on the CPU) advanced in place, so that a
// state_dict() not cloned sees it move with the moments (optimizer.h).
void count_step(std::map<std::string, Tensor>& st, double step) {
  const auto it = st.find("step");
  if (it == st.end())
    st["step"] = Tensor::scalar(step, runtime::DType::f32);
  else
    it->second.fill_(step);
}

}  // namespace

GroupOptions AdamOptions::to_map() const {
  return {{"lr", lr},
          {"beta1", beta1},
          {"beta2", beta2},
          {"eps", eps},
          {"weight_decay", weight_decay},
          {"amsgrad", amsgrad ? 1.0 : 0.0},
          {"maximize", maximize ? 1.0 : 0.0}};
}

AdamOptions AdamOptions::from_map(const GroupOptions& m) {
  auto get = [&](const char* key) { return detail::group_option(m, key, "Adam"); };
  return {.lr = get("lr"),
          .beta1 = get("beta1"),
          .beta2 = get("beta2"),
          .eps = get("eps"),
          .weight_decay = get("weight_decay"),
          .amsgrad = get("amsgrad") != 0.0,
          .maximize = get("maximize") != 0.0};
}

Adam::Adam(std::string name, bool decoupled_weight_decay, AdamOptions defaults)
    : Optimizer(std::move(name), defaults.to_map()),
      decoupled_weight_decay_(decoupled_weight_decay) {}

Adam::Adam(std::vector<Tensor> params, AdamOptions options) : Adam("Adam", false, options) {
  LOCKSTEP_CHECK(!params.empty(), "Adam: got an empty parameter list");
  add_param_group({std::move(params), {}});
}

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions defaults) : Adam("Adam", false, defaults) {
  LOCKSTEP_CHECK(!groups.empty(), "Adam: got an empty list of parameter groups");
  add_param_groups(std::move(groups));
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options) : Adam("AdamW", true, options) {
  LOCKSTEP_CHECK(!params.empty(), "AdamW: got an empty parameter list");
  add_param_group({std::move(params), {}});
}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions defaults)
    : Adam("AdamW", true, defaults) {
  LOCKSTEP_CHECK(!groups.empty(), "AdamW: got an empty list of parameter groups");
  add_param_groups(std::move(groups));
}

void Adam::validate(const GroupOptions& options) const {
  const AdamOptions o = AdamOptions::from_map(options);
  // Written as `x >= 0` checks so that NaN fails them too.
  LOCKSTEP_CHECK(o.lr >= 0.0, "{}: invalid learning rate {}; it must be >= 0", name_, o.lr);
  LOCKSTEP_CHECK(o.eps >= 0.0, "{}: invalid eps {}; it must be >= 0", name_, o.eps);
  LOCKSTEP_CHECK(o.beta1 >= 0.0 && o.beta1 < 1.0, "{}: invalid beta1 {}; it must be in [0, 1)",
                 name_, o.beta1);
  LOCKSTEP_CHECK(o.beta2 >= 0.0 && o.beta2 < 1.0, "{}: invalid beta2 {}; it must be in [0, 1)",
                 name_, o.beta2);
  LOCKSTEP_CHECK(o.weight_decay >= 0.0, "{}: invalid weight_decay {}; it must be >= 0", name_,
                 o.weight_decay);
}

void Adam::check_state_keys(std::string_view what, int64_t index,
                            const std::map<std::string, Tensor>& entries) const {
  // No "max_exp_avg_sq" is needed: amsgrad may be turned on after some steps.
  detail::check_state_keys(what, name_, index, entries,
                           {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
                           {"step", "exp_avg", "exp_avg_sq"});
}

void Adam::step() {
  NoGradGuard no_grad;
  // Everything that can refuse the step is checked before anything changes:
  // the options, and every parameter with a gradient and its state.
  for (size_t g = 0; g < groups_.size(); ++g) {
    auto& group = groups_[g];
    validate(group.options);  // a scheduler or the user may have edited them
    const bool amsgrad = AdamOptions::from_map(group.options).amsgrad;
    for (size_t i = 0; i < group.params.size(); ++i) {
      const Tensor& param = group.params[i];
      if (!param.grad().defined()) continue;
      const auto* state = find_state(param);
      if (amsgrad)
        detail::check_step_inputs(name_, g, i, param, state,
                                  {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"});
      else
        detail::check_step_inputs(name_, g, i, param, state, {"step", "exp_avg", "exp_avg_sq"});
      if (param.device().is_cpu()) continue;
      runtime::check_fusable(name_.c_str(), "parameter", param);
      runtime::check_fusable_state(name_.c_str(), state,
                                   {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"});
    }
  }
  runtime::FusedStep<runtime::AdamTensor> on_device;  // every device parameter, stepped together below
  // Their step counts, kept in the state once the launch ran.
  std::vector<std::pair<std::map<std::string, Tensor>*, double>> counted;
  for (auto& group : groups_) {
    const AdamOptions o = AdamOptions::from_map(group.options);
    const bool decay = o.weight_decay != 0.0;
    for (auto& param : group.params) {
      if (!param.grad().defined()) continue;
      Tensor grad = param.grad();
      if (grad.dtype() != param.dtype()) grad = grad.to(param.dtype());
      grad = grad.contiguous();

      auto& st = state_of(param);
      const Tensor* saved_step = detail::find_entry(&st, "step");
      const double step = (saved_step == nullptr ? 0.0 : saved_step->item()) + 1.0;
      Tensor m = state_tensor(st, "exp_avg", param);
      Tensor v = state_tensor(st, "exp_avg_sq", param);
      Tensor vmax = o.amsgrad ? state_tensor(st, "max_exp_avg_sq", param) : Tensor{};
      const auto keep_moments = [&] {
        st["exp_avg"] = m;
        st["exp_avg_sq"] = v;
        if (vmax.defined()) st["max_exp_avg_sq"] = vmax;
      };

      const double bias_correction1 = 1.0 - std::pow(o.beta1, step);
      const double bias_correction2 = 1.0 - std::pow(o.beta2, step);
      if (!param.device().is_cpu()) {
        namespace k = runtime;
        const uint32_t flags = (o.maximize ? k::kMaximize : 0u) | (o.amsgrad ? k::kAmsgrad : 0u) |
                               (decay && !decoupled_weight_decay_ ? k::kL2 : 0u) |
                               (decay && decoupled_weight_decay_ ? k::kDecoupled : 0u);
        using runtime::fused_data;
        // Coefficients rounded to f32 as for the CPU's f32 parameters.
        on_device.add(param, grad,
                    {.param = fused_data(param),
                     .grad = fused_data(grad),
                     .exp_avg = fused_data(m),
                     .exp_avg_sq = fused_data(v),
                     .max_exp_avg_sq = fused_data(vmax),
                     .end = 0,
                     .neg_step_size = static_cast<float>(-(o.lr / bias_correction1)),
                     .bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2)),
                     .decay = static_cast<float>(1.0 - o.lr * o.weight_decay),
                     .weight_decay = static_cast<float>(o.weight_decay),
                     .beta1 = static_cast<float>(o.beta1),
                     .one_minus_beta1 = static_cast<float>(1.0 - o.beta1),
                     .beta2 = static_cast<float>(o.beta2),
                     .one_minus_beta2 = static_cast<float>(1.0 - o.beta2),
                     .eps = static_cast<float>(o.eps),
                     .flags = flags});
        // Written through raw pointers: bump the versions as in-place ops would.
        for (const Tensor* t : {&param, &m, &v, &vmax})
          if (t->defined()) t->storage()->bump_version();
        keep_moments();  // zero-filled if new: as for a parameter not yet stepped
        counted.emplace_back(&st, step);
        continue;
      }
      Tensor p = param.contiguous();
      runtime::dispatch_floating(p.dtype(), "Adam.step", [&](auto tag) {
        using T = decltype(tag);
        using C = runtime::compute_t<T>;
        const Coeffs<C> c{.decay = static_cast<C>(1.0 - o.lr * o.weight_decay),
                          .weight_decay = static_cast<C>(o.weight_decay),
                          .beta1 = static_cast<C>(o.beta1),
                          .one_minus_beta1 = static_cast<C>(1.0 - o.beta1),
                          .beta2 = static_cast<C>(o.beta2),
                          .one_minus_beta2 = static_cast<C>(1.0 - o.beta2),
                          .bias_correction2_sqrt = static_cast<C>(std::sqrt(bias_correction2)),
                          .eps = static_cast<C>(o.eps),
                          .neg_step_size = static_cast<C>(-(o.lr / bias_correction1))};
        adam_dispatch<T>(p.data_ptr<T>(), grad.data_ptr<T>(), m.data_ptr<T>(), v.data_ptr<T>(),
                         vmax.defined() ? vmax.data_ptr<T>() : nullptr, p.numel(), c,
                         decay && !decoupled_weight_decay_, decay && decoupled_weight_decay_,
                         o.amsgrad, o.maximize);
      });
      // Written through raw pointers: bump the versions as in-place ops would.
      p.storage()->bump_version();
      m.storage()->bump_version();
      v.storage()->bump_version();
      if (vmax.defined()) vmax.storage()->bump_version();
      if (!p.is_same(param)) param.copy_(p);
      // Kept once the update ran: a step that throws leaves no count or
      // moments of a step not taken.
      keep_moments();
      count_step(st, step);
    }
  }
  on_device.launch();
  // Only now: a launch that failed leaves the counts as they were (and the
  // new moments at zero, as for a parameter not yet stepped).
  for (const auto& [st, step] : counted) count_step(*st, step);
}

}  // namespace lockstep::optim
