#include "lockstep/optim/sgd.h"

#include <fmt/format.h>

#include "lockstep/optim/update_helpers.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/error.h"

#include "lockstep/runtime/ops/fused_step.h"

namespace lockstep::optim {

using runtime::NoGradGuard;

namespace {

using detail::with_flag;

template <class T>
struct Coeffs {
  T neg_lr, momentum, one_minus_dampening, weight_decay;
  bool maximize;
};

// One pass over a parameter, the rule of sgd.h fused per element. The flags
// are template arguments so each variant is a branch-free loop the compiler
// can vectorise. Arithmetic is in C = compute_t<T> (T itself for f32 and
// f64, float for bf16 and f16) with the coefficients rounded to C first. For
// f32 and f64 that is PyTorch's CPU rounding (mul_(momentum).add_(g,
// alpha=1-dampening), then add_(g, alpha=-lr)); bf16 and f16 values are
// loaded into float and rounded once when stored, as PyTorch's fused kernels
// do.
template <class T, bool kWeightDecay, bool kMomentum, bool kFirst, bool kNesterov>
void sgd_update(T* __restrict__ p, const T* __restrict__ grad, T* __restrict__ buf, int64_t n,
                const Coeffs<runtime::compute_t<T>>& c) {
  using C = runtime::compute_t<T>;
  const bool maximize = c.maximize;
  for (int64_t i = 0; i < n; ++i) {
    const C pi = static_cast<C>(p[i]);
    C d = static_cast<C>(grad[i]);
    if (maximize) d = -d;
    if constexpr (kWeightDecay) d = d + c.weight_decay * pi;
    if constexpr (kMomentum) {
      C b;
      if constexpr (kFirst)
        b = d;
      else
        b = static_cast<C>(buf[i]) * c.momentum + c.one_minus_dampening * d;
      buf[i] = static_cast<T>(b);
      if constexpr (kNesterov)
        d = d + c.momentum * b;
      else
        d = b;
    }
    p[i] = static_cast<T>(pi + c.neg_lr * d);
  }
}

template <class T>
void sgd_dispatch(T* p, const T* grad, T* buf, int64_t n, const Coeffs<runtime::compute_t<T>>& c,
                  bool weight_decay, bool momentum, bool first, bool nesterov) {
  with_flag(weight_decay, [&](auto wd) {
    if (!momentum) {
      sgd_update<T, decltype(wd)::value, false, false, false>(p, grad, buf, n, c);
      return;
    }
    with_flag(first, [&](auto fst) {
      with_flag(nesterov, [&](auto nes) {
        sgd_update<T, decltype(wd)::value, true, decltype(fst)::value, decltype(nes)::value>(
            p, grad, buf, n, c);
      });
    });
  });
}

// A momentum buffer made for a step, kept in the state once the step ran.
struct NewBuffer {
  std::map<std::string, Tensor>* state;
  Tensor buffer;
};

// A device parameter's entry in the fused step; makes its momentum buffer
// (filled by the kernel from the gradient) on first use, into `made`.
void add_fused(runtime::FusedStep<runtime::SgdTensor>& step, const Tensor& param,
               const SGDOptions& o, std::map<std::string, Tensor>* state,
               std::vector<NewBuffer>& made) {
  namespace k = runtime;
  Tensor grad = param.grad();
  if (grad.dtype() != param.dtype()) grad = grad.to(param.dtype());
  grad = grad.contiguous();
  uint32_t flags =
      (o.maximize ? k::kMaximize : 0u) | (o.weight_decay != 0.0 ? k::kWeightDecay : 0u);
  Tensor buf;
  if (state != nullptr) {  // with momentum
    flags |= k::kMomentum | (o.nesterov ? k::kNesterov : 0u);
    auto& st = *state;
    auto it = st.find("momentum_buffer");
    if (it == st.end()) {
      buf = Tensor::empty(param.shape(), param.dtype(), param.device());
      flags |= k::kFirstStep;
      made.push_back({&st, buf});
    } else {
      buf = it->second;
    }
    // Written through raw pointers: bump the versions as in-place ops would.
    buf.storage()->bump_version();
  }
  param.storage()->bump_version();
  // Coefficients rounded to f32 as for the CPU's f32 parameters.
  step.add(param, grad,
           {.param = runtime::fused_data(param),
            .grad = runtime::fused_data(grad),
            .momentum_buffer = runtime::fused_data(buf),
            .end = 0,
            .neg_lr = static_cast<float>(-o.lr),
            .momentum = static_cast<float>(o.momentum),
            .one_minus_dampening = static_cast<float>(1.0 - o.dampening),
            .weight_decay = static_cast<float>(o.weight_decay),
            .flags = flags});
}

}  // namespace

GroupOptions SGDOptions::to_map() const {
  return {{"lr", lr},
          {"momentum", momentum},
          {"dampening", dampening},
          {"weight_decay", weight_decay},
          {"nesterov", nesterov ? 1.0 : 0.0},
          {"maximize", maximize ? 1.0 : 0.0}};
}

SGDOptions SGDOptions::from_map(const GroupOptions& m) {
  auto get = [&](const char* key) { return detail::group_option(m, key, "SGD"); };
  return {.lr = get("lr"),
          .momentum = get("momentum"),
          .dampening = get("dampening"),
          .weight_decay = get("weight_decay"),
          .nesterov = get("nesterov") != 0.0,
          .maximize = get("maximize") != 0.0};
}

SGD::SGD(std::vector<Tensor> params, SGDOptions options) : Optimizer("SGD", options.to_map()) {
  LOCKSTEP_CHECK(!params.empty(), "SGD: got an empty parameter list");
  add_param_group({std::move(params), {}});
}

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions defaults)
    : Optimizer("SGD", defaults.to_map()) {
  LOCKSTEP_CHECK(!groups.empty(), "SGD: got an empty list of parameter groups");
  add_param_groups(std::move(groups));
}

void SGD::validate(const GroupOptions& options) const {
  const SGDOptions o = SGDOptions::from_map(options);
  // Written as `x >= 0` checks so that NaN fails them too.
  LOCKSTEP_CHECK(o.lr >= 0.0, "SGD: invalid learning rate {}; it must be >= 0", o.lr);
  LOCKSTEP_CHECK(o.momentum >= 0.0, "SGD: invalid momentum {}; it must be >= 0", o.momentum);
  LOCKSTEP_CHECK(o.weight_decay >= 0.0, "SGD: invalid weight_decay {}; it must be >= 0",
                 o.weight_decay);
  LOCKSTEP_CHECK(!o.nesterov || (o.momentum > 0.0 && o.dampening == 0.0),
                 "SGD: Nesterov momentum requires a momentum > 0 and zero dampening (got "
                 "momentum {}, dampening {})",
                 o.momentum, o.dampening);
}

void SGD::check_state_keys(std::string_view what, int64_t index,
                           const std::map<std::string, Tensor>& entries) const {
  detail::check_state_keys(what, name_, index, entries, {"momentum_buffer"}, {});
}

void SGD::step() {
  NoGradGuard no_grad;
  // Everything that can refuse the step is checked before anything changes:
  // the options, and every parameter with a gradient and its buffer.
  for (size_t g = 0; g < groups_.size(); ++g) {
    auto& group = groups_[g];
    validate(group.options);  // a scheduler or the user may have edited them
    const bool momentum = SGDOptions::from_map(group.options).momentum != 0.0;
    for (size_t i = 0; i < group.params.size(); ++i) {
      const Tensor& param = group.params[i];
      if (!param.grad().defined()) continue;
      const auto* state = momentum ? find_state(param) : nullptr;
      detail::check_step_inputs("SGD", g, i, param, state, {"momentum_buffer"});
      if (param.device().is_cpu()) continue;
      runtime::check_fusable("SGD", "parameter", param);
      runtime::check_fusable_state("SGD", state, {"momentum_buffer"});
    }
  }
  runtime::FusedStep<runtime::SgdTensor> on_device;  // every device parameter, stepped together below
  std::vector<NewBuffer> made;                        // their new momentum buffers
  for (auto& group : groups_) {
    const SGDOptions o = SGDOptions::from_map(group.options);
    for (auto& param : group.params) {
      if (!param.grad().defined()) continue;
      if (!param.device().is_cpu()) {
        add_fused(on_device, param, o, o.momentum != 0.0 ? &state_of(param) : nullptr, made);
        continue;
      }
      // The fast path is the usual case: contiguous parameter and gradient of
      // the same dtype. Anything else goes through contiguous copies.
      Tensor grad = param.grad();
      if (grad.dtype() != param.dtype()) grad = grad.to(param.dtype());
      grad = grad.contiguous();
      Tensor p = param.contiguous();  // `param` itself when contiguous

      Tensor buf;
      bool first = false;
      if (o.momentum != 0.0) {
        const Tensor* saved = detail::find_entry(find_state(param), "momentum_buffer");
        first = saved == nullptr;
        buf = first ? Tensor::empty(param.shape(), param.dtype(), param.device())
                    : saved->contiguous();
      }

      const int64_t n = p.numel();
      runtime::dispatch_floating(p.dtype(), "SGD.step", [&](auto tag) {
        using T = decltype(tag);
        using C = runtime::compute_t<T>;
        const Coeffs<C> c{static_cast<C>(-o.lr), static_cast<C>(o.momentum),
                          static_cast<C>(1.0 - o.dampening), static_cast<C>(o.weight_decay),
                          o.maximize};
        sgd_dispatch<T>(p.data_ptr<T>(), grad.data_ptr<T>(), buf.defined() ? buf.data_ptr<T>() : nullptr,
                        n, c, o.weight_decay != 0.0, o.momentum != 0.0, first, o.nesterov);
      });
      // Written through raw pointers: bump the versions as an in-place op
      // would, so a graph that saved the old values refuses to backward.
      p.storage()->bump_version();
      if (buf.defined()) buf.storage()->bump_version();
      if (!p.is_same(param)) param.copy_(p);
      // Kept once written: a buffer made for the step is never left unfilled.
      if (buf.defined()) state_of(param)["momentum_buffer"] = buf;
    }
  }
  on_device.launch();
  // Only now: a launch that failed leaves no unwritten buffer behind.
  for (NewBuffer& b : made) (*b.state)["momentum_buffer"] = std::move(b.buffer);
}

}  // namespace lockstep::optim
