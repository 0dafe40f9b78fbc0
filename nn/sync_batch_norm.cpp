#include "lockstep/nn/sync_batch_norm.h"

#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "lockstep/nn/detail/collective_context.h"
#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/autograd/affine_inputs.h"
#include "lockstep/runtime/autograd/checkpoint.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/device_backend.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops/sync_batch_norm.h"

namespace lockstep::nn {
namespace {

using collectives::ProcessGroup;
using runtime::BackwardArgs;

// The "more than 1 value per channel" check, made on the global count every
// rank agrees on, so that all ranks throw together instead of leaving the
// others waiting.
void check_global_count(int64_t count, const Tensor& x_in) {
  LOCKSTEP_CHECK(count > 1,
                 "SyncBatchNorm: expected more than 1 value per channel over all ranks when "
                 "training, got {} (local input {})",
                 count, runtime::shape_str(x_in.shape()));
}

// Training-mode batch norm over the global batch of `group`; see the header
// for the two collectives, on f64 tensors on x's device (NCCL keeps them
// there; gloo, shm and mpi stage device tensors through host memory). The
// per-channel passes are runtime/ops/sync_batch_norm.h's, queued on the
// device's current stream off the CPU: the host waits for a device only when
// this rank's batch has at most one value per channel, since only then can
// the global count be <= 1 (when every rank's is). running_mean/var, when
// defined, are updated in place with `momentum`.
Tensor sync_batch_norm(const Tensor& x_in, const Tensor& weight, const Tensor& bias,
                       const Tensor& running_mean, const Tensor& running_var, double momentum,
                       double eps, const std::shared_ptr<ProcessGroup>& group) {
  namespace sbn = runtime::sync_bn;
  // Under autocast, as batch_norm: in f32; the running statistics as they are.
  if (auto c = runtime::detail::autocast_inputs(runtime::detail::CastPolicy::f32,
                                                {x_in, weight, bias}))
    return sync_batch_norm((*c)[0], (*c)[1], (*c)[2], running_mean, running_var, momentum, eps,
                           group);
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
  LOCKSTEP_CHECK(x_in.dtype() == DType::f32 || x_in.dtype() == DType::f64,
                 "SyncBatchNorm on {}: dtype {} is not supported; use f32 or f64 (convert the "
                 "module and the input with .to())",
                 x_in.device().str(), dtype_name(x_in.dtype()));
  const runtime::Device dev = x_in.device();
  const runtime::CurrentDevice on_device(dev);
  const Tensor x = x_in.contiguous();
  const int64_t c = x.size(1);
  int64_t local_count = x.size(0);
  for (int64_t d = 2; d < x.dim(); ++d) local_count *= x.size(d);

  // 1. Local statistics, packed [mean | var | count], gathered from every rank.
  const int world = group->size();
  const Tensor local = sbn::local_stats(x);
  Tensor gathered = Tensor::empty({world * (2 * c + 1)}, DType::f64, dev);
  // A rank that runs forward alone (validation on rank 0 with the model
  // left in train mode) waits here for the others: the timeout says why.
  detail::with_collective_context(
      [&] { group->allgather(gathered, local, {.timeout = {}})->wait(); },
      [&] {
        return fmt::format(
            "SyncBatchNorm on rank {}: the all-gather of the batch statistics, which every "
            "forward in train mode starts, failed",
            group->rank());
      },
      [] {
        return std::string(
            "Every rank of its group must run each train-mode forward of a model with "
            "SyncBatchNorm. To evaluate on some ranks only (validation on rank 0), put the model "
            "in eval mode first (model.eval(): SyncBatchNorm then normalises with its running "
            "statistics and communicates nothing), and back in train mode before training "
            "resumes");
      });
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
        const runtime::CurrentDevice on_device(dev);
        const Tensor& xs = a.saved[0];
        const Tensor gy = a.grad.contiguous();
        const bool need_w = w_at >= 0 && a.needs[w_at];
        const bool need_b = b_at >= 0 && a.needs[b_at];
        std::vector<Tensor> grads(a.needs.size());
        sbn::GradSums g = sbn::grad_sums(gy, xs, stats, need_w, need_b);
        if (need_w) grads[w_at] = g.grad_weight;
        if (need_b) grads[b_at] = g.grad_bias;
        // Whether the input needs a gradient is the same on every rank (same
        // model), so either all ranks all-reduce here or none does.
        if (!a.needs[0]) return grads;
        group->allreduce(g.sums, {.op = collectives::ReduceOp::Sum, .timeout = {}})->wait();
        grads[0] = sbn::grad_input(gy, xs, g.sums, stats, w_at >= 0 ? a.saved[1] : Tensor());
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
  // The running-statistics bookkeeping of BatchNormBase::forward, which a
  // checkpoint's recomputation in backward does not repeat: the batch was
  // counted once, in the forward. As there, the batch is counted once it is
  // accepted: a global batch of one value per channel, refused on every rank,
  // leaves num_batches_tracked as it was.
  const bool update = options.track_running_stats && !runtime::in_checkpoint_recomputation();
  double factor = options.momentum.value_or(0.0);
  if (update && !options.momentum) factor = 1.0 / (num_batches_tracked.item() + 1.0);
  Tensor out = sync_batch_norm(x, weight, bias, update ? running_mean : Tensor(),
                               update ? running_var : Tensor(), factor, options.eps, group_);
  if (update) {
    runtime::NoGradGuard no_grad;
    num_batches_tracked.add_(Tensor::full({}, 1.0, DType::i64, num_batches_tracked.device()));
  }
  return out;
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

// A module that convert() replaces: a BatchNorm, or a SyncBatchNorm on
// another group than `group` (or none), which is made again on `group` (as
// PyTorch converts every _BatchNorm), so that one built before the group
// existed synchronises over it. One already on `group` stays as it is.
const BatchNormBase* as_batch_norm(const Module& m,
                                   const std::shared_ptr<ProcessGroup>& group) {
  if (auto* bn = dynamic_cast<const SyncBatchNorm*>(&m))
    return bn->group() == group ? nullptr : bn;
  if (auto* bn = dynamic_cast<const BatchNorm1d*>(&m)) return bn;
  if (auto* bn = dynamic_cast<const BatchNorm2d*>(&m)) return bn;
  return nullptr;
}

// `module` converted; `done` maps each module met so far to its result, so a
// shared one is converted (and walked) once.
std::shared_ptr<Module> convert(const std::shared_ptr<Module>& module,
                                const std::shared_ptr<ProcessGroup>& group,
                                std::unordered_map<const Module*, std::shared_ptr<Module>>& done) {
  if (auto it = done.find(module.get()); it != done.end()) return it->second;
  std::shared_ptr<Module> result = module;
  if (const BatchNormBase* bn = as_batch_norm(*module, group)) {
    result = to_sync(*bn, group);
  } else {
    // A copy of the entries: replace_child changes them.
    const NamedList<std::shared_ptr<Module>> entries = module->child_list();
    for (const auto& [name, child] : entries) {
      auto converted = convert(child, group, done);
      if (converted != child) module->replace_child(name, converted);
    }
  }
  done.emplace(module.get(), result);
  return result;
}

}  // namespace

std::shared_ptr<Module> SyncBatchNorm::replicate() const {
  LOCKSTEP_CHECK(group_ == nullptr || group_->size() == 1,
                 "SyncBatchNorm: cannot be replicated for DataParallel on a group of {} ranks: "
                 "the replicas would all enter the group's collectives; use "
                 "DistributedDataParallel (one device per process) to synchronise BatchNorm "
                 "across devices",
                 group_ == nullptr ? 0 : group_->size());
  return std::make_shared<SyncBatchNorm>(num_features, group_, options);
}

std::shared_ptr<Module> convert_sync_batchnorm(std::shared_ptr<Module> module,
                                               std::shared_ptr<ProcessGroup> group) {
  LOCKSTEP_CHECK(module != nullptr, "convert_sync_batchnorm: the module is null");
  std::unordered_map<const Module*, std::shared_ptr<Module>> done;
  return convert(module, group, done);
}

}  // namespace lockstep::nn
