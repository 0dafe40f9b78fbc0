#include "lockstep/nn/sync_batch_norm.h"

#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "lockstep/config.h"
#include "lockstep/runtime/autograd/affine_inputs.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops/norm_kernels.h"
#if LOCKSTEP_HAVE_CUDA
#include "lockstep/runtime/cuda/device_guard.h"
#include "lockstep/runtime/cuda/ops/sync_batch_norm.h"
#endif

namespace lockstep::nn {
namespace {

using collectives::ProcessGroup;
using runtime::BackwardArgs;
using runtime::norm_kernels::ChannelShape;

std::vector<double> values(const Tensor& t) { return t.detach().to_vector<double>(); }

// The global statistics of one forward, shared with its backward.
struct GlobalStats {
  std::vector<double> mean, invstd;
  int64_t count = 0;  // values per channel over all ranks
};

// Combines per-rank (mean, biased var, count) into the global ones without
// cancellation: M2 = sum_r n_r * (var_r + (mean_r - mean)^2). `gathered` is
// the all-gather of [mean (c) | var (c) | count (1)] from every rank.
void combine(const std::vector<double>& gathered, int world, int64_t c, std::vector<double>& mean,
             std::vector<double>& var, int64_t& count) {
  const size_t stride = static_cast<size_t>(2 * c + 1);
  double n = 0;
  for (int r = 0; r < world; ++r) n += gathered[r * stride + 2 * c];
  count = static_cast<int64_t>(n);
  mean.assign(c, 0.0);
  var.assign(c, 0.0);
  if (count == 0) return;
  for (int r = 0; r < world; ++r) {
    const double* g = gathered.data() + r * stride;
    const double w = g[2 * c] / n;
    for (int64_t i = 0; i < c; ++i) mean[i] += w * g[i];
  }
  for (int r = 0; r < world; ++r) {
    const double* g = gathered.data() + r * stride;
    const double w = g[2 * c] / n;
    for (int64_t i = 0; i < c; ++i) {
      const double d = g[i] - mean[i];
      var[i] += w * (g[c + i] + d * d);
    }
  }
}

// The "more than 1 value per channel" check, made on the global count every
// rank agrees on, so that all ranks throw together instead of leaving the
// others waiting.
void check_global_count(int64_t count, const Tensor& x_in) {
  LOCKSTEP_CHECK(count > 1,
                 "SyncBatchNorm: expected more than 1 value per channel over all ranks when "
                 "training, got {} (local input {})",
                 count, runtime::shape_str(x_in.shape()));
}

#if LOCKSTEP_HAVE_CUDA
// CUDA: the same two collectives on f64 tensors on x's device (NCCL keeps
// them there; gloo, shm and mpi stage them through host memory), the
// per-channel work on cuda/ops/sync_batch_norm.h, all queued on the current
// stream. The host waits for the device only when this rank's batch has at
// most one value per channel: only then can the global count be <= 1 (when
// every rank's is), and the gathered counts have to be read to tell.
Tensor sync_batch_norm_cuda(const Tensor& x_in, const Tensor& weight, const Tensor& bias,
                            const Tensor& running_mean, const Tensor& running_var,
                            double momentum, double eps,
                            const std::shared_ptr<ProcessGroup>& group) {
  namespace sbn = runtime::cuda::sync_bn;
  LOCKSTEP_CHECK(x_in.dtype() == DType::f32 || x_in.dtype() == DType::f64,
                 "SyncBatchNorm on CUDA: dtype {} is not supported; use f32 or f64 (convert the "
                 "module and the input with .to())",
                 dtype_name(x_in.dtype()));
  const runtime::Device dev = x_in.device();
  runtime::cuda::DeviceGuard guard(dev.index);
  const Tensor x = x_in.contiguous();
  const int64_t c = x.size(1);
  int64_t local_count = x.size(0);
  for (int64_t d = 2; d < x.dim(); ++d) local_count *= x.size(d);

  // 1. Local statistics, packed [mean | var | count], gathered from every rank.
  const int world = group->size();
  const Tensor local = sbn::local_stats(x);
  Tensor gathered = Tensor::empty({world * (2 * c + 1)}, DType::f64, dev);
  group->allgather(gathered, local, {.timeout = {}})->wait();
  // 2. Global statistics, scale and shift, running statistics.
  const sbn::Combined st = sbn::combine(gathered, world, x.dtype(), weight, bias, running_mean,
                                        running_var, momentum, eps);
  if (local_count <= 1)
    check_global_count(static_cast<int64_t>(st.stats.slice(0, 2 * c, 2 * c + 1).item()), x_in);
  // 3. y = x * scale + shift.
  Tensor out = sbn::affine(x, st.scale, st.shift);

  const runtime::AffineInputs graph = runtime::affine_inputs(x_in, x, weight, weight, bias);
  const int w_at = graph.w_at, b_at = graph.b_at;
  return runtime::record(
      std::move(out), "SyncBatchNormBackward", graph.inputs, graph.saved,
      [stats = st.stats, group, dev, w_at, b_at](const BackwardArgs& a) -> std::vector<Tensor> {
        runtime::cuda::DeviceGuard guard(dev.index);
        const Tensor& xs = a.saved[0];
        const Tensor gy = a.grad.contiguous();
        const bool need_w = w_at >= 0 && a.needs[w_at];
        const bool need_b = b_at >= 0 && a.needs[b_at];
        std::vector<Tensor> grads(a.needs.size());
        sbn::GradSums g = sbn::grad_sums(gy, xs, stats, need_w, need_b);
        if (need_w) grads[w_at] = g.grad_weight;
        if (need_b) grads[b_at] = g.grad_bias;
        // The same on every rank (same model): all ranks all-reduce or none.
        if (!a.needs[0]) return grads;
        group->allreduce(g.sums, {.op = collectives::ReduceOp::Sum, .timeout = {}})->wait();
        grads[0] = sbn::grad_input(gy, xs, g.sums, stats, w_at >= 0 ? a.saved[1] : Tensor());
        return grads;
      });
}
#endif

// Training-mode batch norm over the global batch of `group`; see the header
// for the two collectives. running_mean/var, when defined, are updated in
// place with `momentum`.
Tensor sync_batch_norm(const Tensor& x_in, const Tensor& weight, const Tensor& bias,
                       const Tensor& running_mean, const Tensor& running_var, double momentum,
                       double eps, const std::shared_ptr<ProcessGroup>& group) {
  for (const auto& [name, t] : {std::pair{"weight", &weight}, std::pair{"bias", &bias},
                                std::pair{"running_mean", &running_mean},
                                std::pair{"running_var", &running_var}}) {
    LOCKSTEP_CHECK(!t->defined() || t->device() == x_in.device(),
                   "SyncBatchNorm: input is on {} but {} is on {}; move the module with "
                   ".to(device)",
                   x_in.device().str(), name, t->device().str());
  }
  for (const Tensor* p : {&weight, &bias}) {
    LOCKSTEP_CHECK(!p->defined() || p->dtype() == x_in.dtype(),
                   "SyncBatchNorm: input is {} but the parameters are {}; convert the module "
                   "with .to()",
                   dtype_name(x_in.dtype()), dtype_name(p->dtype()));
  }
#if LOCKSTEP_HAVE_CUDA
  if (x_in.device().is_cuda())
    return sync_batch_norm_cuda(x_in, weight, bias, running_mean, running_var, momentum, eps,
                                group);
#endif
  LOCKSTEP_CHECK(x_in.device().is_cpu(), "SyncBatchNorm: no kernel for device {} in this build",
                 x_in.device().str());
  const Tensor x = x_in.contiguous();
  const int64_t c = x.size(1);
  int64_t inner = 1;
  for (int64_t d = 2; d < x.dim(); ++d) inner *= x.size(d);
  const ChannelShape s{x.size(0), c, inner};

  // 1. Local statistics, packed [mean | var | count].
  std::vector<double> local(static_cast<size_t>(2 * c + 1));
  runtime::dispatch_float(x.dtype(), "SyncBatchNorm", [&](auto tag) {
    using T = decltype(tag);
    runtime::norm_kernels::channel_stats<T>(s, x.data_ptr<T>(), local.data(), local.data() + c);
  });
  local[2 * c] = static_cast<double>(s.count());

  // 2. One all-gather, then the same combination on every rank.
  const int world = group->size();
  Tensor packed = Tensor::from_vector(local, {2 * c + 1});
  Tensor gathered = Tensor::zeros({world * (2 * c + 1)}, DType::f64);
  group->allgather(gathered, packed, {.timeout = {}})->wait();
  auto st = std::make_shared<GlobalStats>();
  std::vector<double> var;
  combine(gathered.to_vector<double>(), world, c, st->mean, var, st->count);
  // After the collective: see check_global_count.
  check_global_count(st->count, x_in);
  st->invstd.resize(c);
  for (int64_t i = 0; i < c; ++i) st->invstd[i] = 1.0 / std::sqrt(var[i] + eps);

  if (running_mean.defined()) {
    runtime::NoGradGuard no_grad;
    const double unbias = static_cast<double>(st->count) / static_cast<double>(st->count - 1);
    std::vector<double> rm = values(running_mean), rv = values(running_var);
    for (int64_t i = 0; i < c; ++i) {
      rm[i] = (1 - momentum) * rm[i] + momentum * st->mean[i];
      rv[i] = (1 - momentum) * rv[i] + momentum * var[i] * unbias;
    }
    Tensor(running_mean).copy_(Tensor::from_vector(rm, {c}));
    Tensor(running_var).copy_(Tensor::from_vector(rv, {c}));
  }

  // 3. y = x * scale + shift with the global statistics.
  const std::vector<double> w = weight.defined() ? values(weight) : std::vector<double>(c, 1.0);
  const std::vector<double> b = bias.defined() ? values(bias) : std::vector<double>(c, 0.0);
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  runtime::dispatch_float(x.dtype(), "SyncBatchNorm", [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> scale(c), shift(c);
    for (int64_t i = 0; i < c; ++i) {
      scale[i] = static_cast<T>(w[i] * st->invstd[i]);
      shift[i] = static_cast<T>(b[i] - st->mean[i] * w[i] * st->invstd[i]);
    }
    runtime::norm_kernels::channel_affine<T>(s, x.data_ptr<T>(), scale.data(), shift.data(),
                                             out.data_ptr<T>());
  });

  const runtime::AffineInputs graph = runtime::affine_inputs(x_in, x, weight, weight, bias);
  const int w_at = graph.w_at, b_at = graph.b_at;
  return runtime::record(
      std::move(out), "SyncBatchNormBackward", graph.inputs, graph.saved,
      [s, st, group, w_at, b_at](const BackwardArgs& a) -> std::vector<Tensor> {
        const Tensor& xs = a.saved[0];
        const Tensor gy = a.grad.contiguous();
        const int64_t c = s.c;
        const std::vector<double> w =
            w_at >= 0 ? a.saved[1].to_vector<double>() : std::vector<double>(c, 1.0);
        const bool need_x = a.needs[0];
        const bool need_w = w_at >= 0 && a.needs[w_at];
        const bool need_b = b_at >= 0 && a.needs[b_at];
        std::vector<Tensor> grads(a.needs.size());
        // Local sums around the global mean: the weight and bias gradients
        // as they are, and (summed over ranks) the input gradient's terms.
        std::vector<double> sums(static_cast<size_t>(2 * c));
        runtime::dispatch_float(gy.dtype(), "SyncBatchNorm backward", [&](auto tag) {
          using T = decltype(tag);
          runtime::norm_kernels::channel_grad_sums<T>(s, gy.data_ptr<T>(), xs.data_ptr<T>(),
                                                      st->mean.data(), sums.data(),
                                                      sums.data() + c);
        });
        if (need_w) {
          std::vector<double> gw(c);
          for (int64_t i = 0; i < c; ++i) gw[i] = sums[c + i] * st->invstd[i];
          grads[w_at] = Tensor::from_vector(gw, {c}).to(gy.dtype());
        }
        if (need_b) {
          grads[b_at] =
              Tensor::from_vector(std::vector<double>(sums.begin(), sums.begin() + c), {c})
                  .to(gy.dtype());
        }
        // Whether the input needs a gradient is the same on every rank (same
        // model), so either all ranks all-reduce here or none does.
        if (!need_x) return grads;
        Tensor total = Tensor::from_vector(sums, {2 * c});
        group->allreduce(total, {.op = collectives::ReduceOp::Sum, .timeout = {}})->wait();
        const std::vector<double> g = total.to_vector<double>();
        // gx = w*invstd * (gy - sum_gy/m - (x - mean) * invstd^2 * sum_gy_xc/m)
        // over the global count m, folded into gx = gy * ka + x * kb + kc.
        const double m = static_cast<double>(st->count);
        runtime::dispatch_float(gy.dtype(), "SyncBatchNorm backward", [&](auto tag) {
          using T = decltype(tag);
          std::vector<T> ka(c), kb(c), kc(c);
          for (int64_t i = 0; i < c; ++i) {
            const double is = st->invstd[i], k1 = w[i] * is;
            const double kbi = -k1 * is * is * g[c + i] / m;
            ka[i] = static_cast<T>(k1);
            kb[i] = static_cast<T>(kbi);
            kc[i] = static_cast<T>(-k1 * g[i] / m - kbi * st->mean[i]);
          }
          Tensor gx = Tensor::empty(xs.shape(), xs.dtype());
          runtime::norm_kernels::channel_grad_input<T>(s, gy.data_ptr<T>(), xs.data_ptr<T>(),
                                                       ka.data(), kb.data(), kc.data(),
                                                       gx.data_ptr<T>());
          grads[0] = gx;
        });
        return grads;
      });
}

}  // namespace

SyncBatchNorm::SyncBatchNorm(int64_t num_features, std::shared_ptr<ProcessGroup> group,
                             BatchNormOptions options)
    : BatchNormBase(num_features, options), group_(std::move(group)) {}

void SyncBatchNorm::check_input_dim(const Tensor& x) const {
  LOCKSTEP_CHECK(x.defined() && x.dim() >= 2,
                 "SyncBatchNorm: expected input [N, C], [N, C, L] or [N, C, H, W] (got {})",
                 x.defined() ? fmt::format("{}D input", x.dim()) : std::string("undefined"));
}

Tensor SyncBatchNorm::forward(const Tensor& x) {
  // Eval mode and a single rank need no communication: plain BatchNorm.
  if (!is_training() || group_ == nullptr || group_->size() == 1)
    return BatchNormBase::forward(x);
  check_input_dim(x);
  LOCKSTEP_CHECK(x.size(1) == num_features,
                 "SyncBatchNorm({}): input of shape {} has {} channels in dim 1", num_features,
                 runtime::shape_str(x.shape()), x.size(1));
  // The running-statistics bookkeeping of BatchNormBase::forward.
  double factor = options.momentum.value_or(0.0);
  if (options.track_running_stats) {
    {
      runtime::NoGradGuard no_grad;
      num_batches_tracked.add_(Tensor::full({}, 1.0, DType::i64, num_batches_tracked.device()));
    }
    if (!options.momentum) factor = 1.0 / num_batches_tracked.item();
  }
  return sync_batch_norm(x, weight, bias, running_mean, running_var, factor, options.eps, group_);
}

namespace {

// A SyncBatchNorm with `bn`'s options, mode, dtype, device and values.
std::shared_ptr<SyncBatchNorm> to_sync(const BatchNormBase& bn,
                                       const std::shared_ptr<ProcessGroup>& group) {
  auto sync = std::make_shared<SyncBatchNorm>(bn.num_features, group, bn.options);
  const std::vector<Tensor> params = bn.parameters(false);
  const Tensor like = !params.empty() ? params.front() : bn.running_mean;
  if (like.defined()) {
    sync->to(like.dtype());
    sync->to(like.device());
  }
  sync->load_state_dict(bn.state_dict());
  if (bn.weight.defined()) {  // a frozen BatchNorm stays frozen
    sync->weight.requires_grad_(bn.weight.requires_grad());
    sync->bias.requires_grad_(bn.bias.requires_grad());
  }
  sync->train(bn.is_training());
  return sync;
}

const BatchNormBase* as_batch_norm(const Module& m) {
  if (auto* bn = dynamic_cast<const BatchNorm1d*>(&m)) return bn;
  if (auto* bn = dynamic_cast<const BatchNorm2d*>(&m)) return bn;
  return nullptr;
}

}  // namespace

std::shared_ptr<Module> convert_sync_batchnorm(std::shared_ptr<Module> module,
                                               std::shared_ptr<ProcessGroup> group) {
  LOCKSTEP_CHECK(module != nullptr, "convert_sync_batchnorm: the module is null");
  if (const BatchNormBase* bn = as_batch_norm(*module)) return to_sync(*bn, group);
  for (const auto& [name, child] : module->named_children()) {
    auto converted = convert_sync_batchnorm(child, group);
    if (converted != child) module->replace_child(name, converted);
  }
  return module;
}

}  // namespace lockstep::nn
