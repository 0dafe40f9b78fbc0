#include "lockstep/nn/ddp/reducer.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "lockstep/collectives/work.h"
#include "lockstep/nn/ddp/bucket_plan.h"
#include "lockstep/nn/detail/drop_guard.h"
#include "lockstep/nn/detail/storage_alias.h"
#include "lockstep/nn/join.h"
#include "lockstep/runtime/autograd/backward_callbacks.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops/scale_into.h"

namespace lockstep::nn {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// A bucket cap in bytes: at least 1, at most INT64_MAX (DDP's constructor
// has checked that `mb` is finite and positive; 1e13 MiB is past int64, and
// 1e-7 MiB is under a byte).
int64_t cap_bytes(double mb) {
  const double bytes = mb * kMiB;
  constexpr double two_to_63 = 9223372036854775808.0;
  if (!(bytes < two_to_63)) return std::numeric_limits<int64_t>::max();
  return std::max<int64_t>(1, static_cast<int64_t>(bytes));
}

// Which reducer hears each parameter's gradients: the newest live one that
// hooked it. A module wrapped again (as after changing requires_grad, which
// the older wrapper refuses) keeps the older wrapper's hooks until that one
// is destroyed; its reducer, which no forward prepared, would fail the new
// wrapper's backward. PyTorch's reducer ignores gradients it did not expect;
// here the older one hears nothing until the newer one is gone.
class Listeners {
 public:
  void add(const runtime::TensorImpl* param, const Reducer* reducer) {
    std::lock_guard lock(mutex_);
    by_param_[param].push_back(reducer);
  }
  void remove(const runtime::TensorImpl* param, const Reducer* reducer) {
    std::lock_guard lock(mutex_);
    auto it = by_param_.find(param);
    if (it == by_param_.end()) return;
    std::erase(it->second, reducer);
    if (it->second.empty()) by_param_.erase(it);
  }
  bool hears(const runtime::TensorImpl* param, const Reducer* reducer) const {
    std::lock_guard lock(mutex_);
    return hears_locked(param, reducer);
  }
  // The first of `params` that `reducer` does not hear, or null.
  const std::string* first_unheard(const std::vector<std::pair<std::string, Tensor>>& params,
                                   const Reducer* reducer) const {
    std::lock_guard lock(mutex_);
    for (const auto& [name, p] : params)
      if (!hears_locked(p.impl_ptr(), reducer)) return &name;
    return nullptr;
  }

 private:
  bool hears_locked(const runtime::TensorImpl* param, const Reducer* reducer) const {
    auto it = by_param_.find(param);
    return it != by_param_.end() && it->second.back() == reducer;
  }

  mutable std::mutex mutex_;
  std::unordered_map<const runtime::TensorImpl*, std::vector<const Reducer*>> by_param_;
};

Listeners& listeners() {
  static Listeners* all = new Listeners;  // never destroyed: reducers may outlive statics
  return *all;
}

}  // namespace

Reducer::Reducer(std::vector<std::pair<std::string, Tensor>> params,
                 std::vector<std::pair<std::string, Tensor>> frozen,
                 collectives::ProcessGroup& group, DdpOptions options)
    : params_(std::move(params)),
      frozen_(std::move(frozen)),
      group_(group),
      options_(options),
      comm_hook_(comm_hooks::allreduce()) {
  // As PyTorch: with a static graph the unused parameters are learnt from the
  // first averaged iteration whether or not find_unused_parameters is set.
  if (options_.static_graph) options_.find_unused_parameters = true;
  reserve_shared_pool();
  build_buckets(reverse_order(params_.size()));
  ready_.assign(params_.size(), false);
  locally_used_.assign(params_.size(), 0);
  kept_grads_.assign(params_.size(), Tensor{});
  unused_.assign(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i) {
    listeners().add(params_[i].second.impl_ptr(), this);
    hook_ids_.push_back(params_[i].second.register_post_accumulate_grad_hook([this, i](Tensor&) {
      if (listeners().hears(params_[i].second.impl_ptr(), this)) on_gradient_ready(i);
    }));
  }
  if (!params_.empty() && !params_.front().second.device().is_cpu())
    timeline_ = std::make_unique<DeviceTimeline>(params_.front().second.device());
}

const DdpStats& Reducer::stats() const {
  if (timeline_) timeline_->resolve(stats_);
  return stats_;
}

void Reducer::forward_started() {
  if (timeline_) timeline_->forward_started();
}

Reducer::~Reducer() {
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].second.remove_hook(hook_ids_[i]);
    listeners().remove(params_[i].second.impl_ptr(), this);
  }
  // Buckets still in flight (an iteration that ended in an error) must
  // complete before their buffers are freed.
  for (auto& b : buckets_) {
    if (b.result.work) {
      try {
        b.result.work->wait();
      } catch (...) {  // the iteration already failed; nothing to report twice
      }
    }
  }
}

// Twice the gradients' bytes: the buckets, and the buffers last handed out as
// .grad (write_gradients), which return to the pool when the next ones
// replace them. Collective: every rank builds the same reducer here.
void Reducer::reserve_shared_pool() {
  if (!options_.buckets_in_shared_memory || group_.size() == 1 || params_.empty() ||
      !params_.front().second.device().is_cpu())
    return;
  size_t bytes = 0;
  for (const auto& [name, p] : params_) {
    bytes += static_cast<size_t>(p.numel()) * p.element_size() + 64;  // + a cache line per bucket at most
  }
  pool_ = group_.reserve_shared_pool(2 * bytes);
}

Tensor Reducer::new_bucket_buffer(int64_t numel, DType dtype, runtime::Device device) const {
  if (pool_ && device.is_cpu()) {
    Tensor t = pool_->empty({numel}, dtype);
    if (t.defined()) return t;
  }
  return Tensor::empty({numel}, dtype, device);
}

void Reducer::build_buckets(const std::vector<size_t>& order) {
  std::vector<BucketParam> specs;
  for (const auto& [name, p] : params_) {
    specs.push_back({static_cast<int64_t>(p.numel() * p.element_size()), p.dtype(), p.device()});
  }
  const auto plan =
      assign_buckets(specs, order, cap_bytes(options_.first_bucket_cap_mb),
                     cap_bytes(options_.bucket_cap_mb));
  std::vector<Bucket> buckets;
  slots_.assign(params_.size(), Slot{});
  for (size_t b = 0; b < plan.size(); ++b) {
    Bucket bucket;
    int64_t total = 0;
    for (size_t p : plan[b]) {
      bucket.members.push_back(p);
      bucket.offsets.push_back(total);
      slots_[p] = {b, total};
      total += params_[p].second.numel();
    }
    const Tensor& first = params_[plan[b].front()].second;
    bucket.buffer = new_bucket_buffer(total, first.dtype(), first.device());
    bucket.buffer.fill_(0);
    bucket.pending = bucket.members.size();
    buckets.push_back(std::move(bucket));
  }
  buckets_ = std::move(buckets);
}

Tensor Reducer::slot_view(size_t param) const {
  const Slot& s = slots_[param];
  const Tensor& p = params_[param].second;
  return buckets_[s.bucket].buffer.slice(0, s.offset, s.offset + p.numel()).view(p.shape());
}

void Reducer::register_comm_hook(CommHook hook) {
  LOCKSTEP_CHECK(hook != nullptr, "register_comm_hook: the hook is empty");
  // As PyTorch: a second hook would silently replace the first.
  LOCKSTEP_CHECK(!hook_registered_,
                 "register_comm_hook: a hook is already registered, and DDP takes one; call "
                 "the first from inside the second to combine them");
  // A forward alone (a check of the output's shape) changes no bucket.
  LOCKSTEP_CHECK(!gradients_seen_,
                 "register_comm_hook: register the hook before the first backward, the same way "
                 "on every rank");
  comm_hook_ = std::move(hook);
  hook_registered_ = true;
}

std::vector<BucketInfo> Reducer::bucket_info() const {
  std::vector<BucketInfo> out;
  for (const Bucket& b : buckets_) {
    BucketInfo info;
    for (size_t p : b.members) info.names.push_back(params_[p].first);
    info.bytes = b.buffer.numel() * static_cast<int64_t>(b.buffer.element_size());
    info.dtype = b.buffer.dtype();
    info.in_shared_memory = pool_ && pool_->holds(b.buffer);
    out.push_back(std::move(info));
  }
  return out;
}

// A rank that skips a batch after an error drains what its backward started
// (drain_and_reset), but the other ranks' next calls pair with those
// all-reduces in order: where they started fewer (their error came earlier,
// or they had none), a bucket of their next backward would be summed with
// this rank's failed one, and each later bucket with the wrong one, of equal
// size, without a word. A barrier after the drained buckets, where this rank
// started any, makes the sequences of two ranks that started different
// numbers differ at once (a barrier against an all-reduce), and the check of
// every collective fails both; where every rank failed at the same point,
// the barriers match and training goes on.
//
// The check waits for a forward that communicates anyway (train mode): an
// eval-mode forward, which rank 0 may run alone to validate, only drains, or
// its barrier would meet the other ranks' next collective (a metric's
// all-reduce) and fail a group whose ranks all failed at one point.
void Reducer::settle_failed_backward(bool communicates) {
  if (mode_ == Mode::sync && backward_started_) {
    unsettled_launches_ = std::max(unsettled_launches_, next_launch_);
    drain_and_reset();
  }
  if (!communicates || unsettled_launches_ == 0) return;
  const size_t launched = std::exchange(unsettled_launches_, 0);
  if (group_.size() == 1) return;
  try {
    group_.barrier()->wait();
  } catch (const collectives::CollectiveMismatch& e) {
    throw Error(fmt::format(
        "DistributedDataParallel on rank {}: this rank's previous backward failed after "
        "starting the all-reduce of {} of its {} gradient bucket(s), and other ranks did not "
        "stop at the same point (they finished that backward, or failed before or after it), "
        "so their collectives no longer pair with this rank's: the group is unusable now. "
        "Create a new process group and DistributedDataParallel on every rank, or restart the "
        "job. To skip a bad batch, decide on every rank alike before backward (all-reduce a "
        "flag), or fail every rank. {}",
        group_.rank(), launched, buckets_.size(), e.what()));
  }
}

// A rank that froze the model for a training forward the others did not freeze
// starts no bucket in its backward while theirs start theirs: their
// all-reduces would pair with this rank's next backward's, one iteration
// apart, equal in size, without a word. A barrier here makes the ranks'
// calls differ at once (a barrier against a bucket's all-reduce or a
// buffer broadcast), and the check of every collective fails them all.
void Reducer::agree_frozen_forward() {
  if (group_.size() == 1) return;
  try {
    group_.barrier()->wait();
  } catch (const collectives::CollectiveMismatch& e) {
    throw Error(fmt::format(
        "DistributedDataParallel on rank {}: this forward ran with every parameter of the "
        "wrapped model frozen (requires_grad false), and other ranks' forward did not: they "
        "average gradients that this rank does not give, so the group is unusable now. Freeze "
        "and unfreeze the model on every rank alike (a GAN's discriminator for the "
        "generator's step). {}",
        group_.rank(), e.what()));
  }
}

void Reducer::prepare_for_backward(const std::vector<Tensor>& outputs, bool synced,
                                   bool training, double forward_ms) {
  if (mode_ == Mode::sync && backward_started_) drain_and_reset();
  // As PyTorch: a forward without grad mode (an evaluation, or targets
  // computed under no_grad between a forward and its backward) has no
  // backward and leaves the iteration that an earlier forward prepared.
  if (!runtime::grad_enabled()) return;
  // So does one whose outputs need no gradient (predictions taken with grad
  // mode on, a part of the model that is frozen): nothing can differentiate it.
  const bool expects_backward =
      std::any_of(outputs.begin(), outputs.end(),
                  [](const Tensor& t) { return t.defined() && t.requires_grad(); });
  if (!expects_backward) return;
  // So does one through a model frozen whole (a GAN's discriminator during
  // the generator's step): its backward reaches the inputs only, and none of
  // these parameters gets a gradient to average. Frozen in part is refused
  // (check_parameters_unchanged).
  const auto frozen = [](const auto& named) { return !named.second.requires_grad(); };
  if (std::all_of(params_.begin(), params_.end(), frozen) &&
      std::all_of(frozen_.begin(), frozen_.end(), frozen)) {
    // Not in eval mode: a saliency map or an adversarial input computed on
    // rank 0 alone through the frozen model is no training step.
    if (training) agree_frozen_forward();
    return;
  }
  forward_ms_ = forward_ms;
  forward_end_ = Clock::now();
  if (timeline_) timeline_->forward_ended();
  check_parameters_unchanged();
  if (!synced) {
    const Join* join = active_join();
    const int64_t active = join ? join->active_ranks() : group_.size();
    // As PyTorch: a no_sync() forward leaves armed the averaged iteration of
    // the forward before it (a loss over both forwards' outputs is averaged);
    // the backward after that averaged one accumulates locally. Unless no
    // tensor of that forward's graph is left (an evaluation with grad mode
    // on, its outputs dropped; perhaps on rank 0 only): no backward can come
    // from it, and averaging this forward's backward in its place would
    // all-reduce where the other ranks accumulate.
    if (mode_ == Mode::sync && armed_forward_alive()) {
      deferred_no_sync_active_ = active;
      arm(outputs);  // its gradients are averaged with the armed forward's
      return;
    }
    deferred_no_sync_active_ = 0;
    // Counted by its backward (on_gradient_ready): a forward that none
    // follows adds nothing to the sum, so nothing to the divisor either.
    uncounted_active_ = active;
    mode_ = Mode::no_sync;
    stats_ = DdpStats{.iteration = stats_.iteration, .forward_ms = forward_ms, .synced = false};
    return;
  }
  // Every averaged forward since the last backward armed it: their graphs
  // together (the expired dropped, so an evaluation loop does not grow it).
  if (mode_ != Mode::sync) {
    armed_graph_.clear();
    armed_by_leaf_ = false;
  }
  std::erase_if(armed_graph_, [](const auto& node) { return node.expired(); });
  averaged_outputs_.clear();
  mode_ = Mode::sync;
  uncounted_active_ = 0;
  deferred_no_sync_active_ = 0;
  backward_started_ = false;
  // Searched when the backward begins (begin_backward).
  walked_ = options_.find_unused_parameters && !(options_.static_graph && unused_known_);
  arm(outputs);
}

// Adds a forward's outputs to the graphs that the next averaged backward may
// come from (armed_forward_alive).
void Reducer::arm(const std::vector<Tensor>& outputs) {
  for (const Tensor& t : outputs) {
    if (!t.defined() || !t.requires_grad()) continue;
    if (const auto node = t.grad_fn())
      armed_graph_.push_back(node);
    else
      armed_by_leaf_ = true;  // a parameter returned as it is: alive with the module
  }
}

bool Reducer::armed_forward_alive() const {
  return armed_by_leaf_ ||
         std::any_of(armed_graph_.begin(), armed_graph_.end(),
                     [](const auto& node) { return !node.expired(); });
}

// The reducer hooks and buckets the parameters that required grad when DDP
// was built. One unfrozen since would get a gradient that is never averaged
// (the replicas drift apart); one frozen since would leave its bucket
// waiting. PyTorch leaves both unchecked; a loop over flags costs nothing.
void Reducer::check_parameters_unchanged() const {
  // First: a newer wrapper over the same module takes the gradients (see
  // Listeners), so a backward after this forward would average nothing.
  if (const std::string* name = listeners().first_unheard(params_, this))
    throw Error(fmt::format(
        "DistributedDataParallel on rank {}: parameter '{}' was wrapped in a newer "
        "DistributedDataParallel since this one was built, and the newer one averages its "
        "gradients. Run forward through the newest wrapper (destroy it to use this one again); "
        "for a module shared by two models, wrap one module that holds both instead",
        group_.rank(), *name));
  auto fail = [&](const std::string& name, bool now) {
    throw Error(fmt::format(
        "DistributedDataParallel on rank {}: parameter '{}' {} after the module was wrapped in "
        "DDP (requires_grad is now {}). DDP averages the gradients of the parameters that "
        "required grad when it was constructed, so {}. Re-wrap the module in "
        "DistributedDataParallel after changing requires_grad (on every rank alike), or "
        "freeze all of its parameters for a forward that must not train it (a GAN's "
        "discriminator in the generator's step): such a forward has nothing to average",
        group_.rank(), name, now ? "was unfrozen" : "was frozen", now ? "true" : "false",
        now ? "its gradient would never be averaged and the replicas would drift apart"
            : "its bucket would wait for a gradient that never comes"));
  };
  for (const auto& [name, p] : params_) {
    if (!p.requires_grad()) fail(name, false);
  }
  for (const auto& [name, p] : frozen_) {
    if (p.requires_grad()) fail(name, true);
  }
  // As PyTorch, which checks each gradient against its bucket's type: the
  // buckets keep the dtype and device of construction, so after Module::to an
  // f64 model would be averaged in f32 without a word.
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i].second;
    const Tensor& bucket = buckets_[slots_[i].bucket].buffer;
    if (p.dtype() == bucket.dtype() && p.device() == bucket.device()) continue;
    throw Error(fmt::format(
        "DistributedDataParallel on rank {}: parameter '{}' is {} on {} now, but was {} on {} "
        "when the module was wrapped in DDP (Module::to after wrapping?). Its gradient bucket "
        "keeps the dtype and device it was built with, so its gradient would be averaged in "
        "{}. Convert the module before wrapping it, or wrap the converted module in a new "
        "DistributedDataParallel",
        group_.rank(), params_[i].first, runtime::dtype_name(p.dtype()), p.device().str(),
        runtime::dtype_name(bucket.dtype()), bucket.device().str(),
        runtime::dtype_name(bucket.dtype())));
  }
}

void Reducer::on_gradient_ready(size_t param) {
  const std::string& name = params_[param].first;
  gradients_seen_ = true;
  if (mode_ == Mode::no_sync) {
    if (!averaged_outputs_.empty() && !pass_checked_) check_not_averaged_again(name);
    // Gradients accumulate locally; the next averaged backward must know
    // that this rank has one for this parameter, even if it then goes unused.
    locally_used_[param] = 1;
    // The first gradient of the forward's backward: its iteration joins the
    // window that the next averaged backward divides by.
    if (uncounted_active_ > 0) {
      window_active_ += uncounted_active_;
      ++window_steps_;
      uncounted_active_ = 0;
    }
    return;
  }
  if (mode_ == Mode::idle) {
    throw Error(fmt::format(
        "DistributedDataParallel on rank {}: parameter '{}' received a gradient, but no "
        "ddp.forward() ran since the last averaged backward (a second backward through one "
        "forward, or a forward that bypassed the DDP module). Run forward through DDP before "
        "every backward; to accumulate over several backward passes, wrap all but the last in "
        "ddp.no_sync()",
        group_.rank(), name));
  }
  if (!backward_started_) begin_backward();
  // Not walked this iteration: static_graph marked it ready from the first
  // iteration's walk, which did not reach it. The graph changed.
  if (ready_[param] && unused_[param] && !walked_) {
    throw Error(fmt::format(
        "DistributedDataParallel on rank {}: parameter '{}' received a gradient, but "
        "static_graph keeps the parameters that the first averaged iteration used, and it was "
        "unused then, so DDP did not wait for its gradient. Construct DDP without static_graph "
        "(with find_unused_parameters) if the set of parameters that the loss uses changes "
        "between iterations",
        group_.rank(), name));
  }
  if (ready_[param]) {
    throw Error(fmt::format(
        "DistributedDataParallel on rank {}: parameter '{}' was marked ready twice in one "
        "backward{}. A parameter may contribute to the loss only through the output of "
        "ddp.forward(), once per iteration; otherwise compute the extra term inside the module",
        group_.rank(), name,
        unused_[param] ? " (find_unused_parameters found it unreachable from the tensor this "
                         "backward started from, yet it got a gradient: from another backward "
                         "running meanwhile?)"
                       : ""));
  }
  mark_ready(param, true);
}

void Reducer::begin_backward() {
  backward_started_ = true;
  // A backward that throws part-way drops its callbacks unrun
  // (backward_callbacks.h): the guard then tells backward_failed().
  auto dropped = std::make_shared<detail::DropGuard>([this] { backward_failed(); });
  // When the outermost pass ends: one run inside it (a custom backward that
  // backpropagates a recomputed part) ends before every gradient has come.
  runtime::queue_outermost_backward_callback([this, dropped] {
    dropped->disarm();
    finalize();
  });
  std::fill(ready_.begin(), ready_.end(), false);
  std::fill(kept_grads_.begin(), kept_grads_.end(), Tensor{});
  for (auto& b : buckets_) b.pending = b.members.size();
  num_ready_ = 0;
  next_launch_ = 0;
  ready_order_.clear();
  scale_ = 1.0 / divisor();
  window_active_ = 0;
  window_steps_ = 0;
  stats_ = DdpStats{.iteration = stats_.iteration,
                    .forward_ms = forward_ms_,
                    .gradients_expected = static_cast<int64_t>(params_.size())};
  // Walked only where a no_sync() forward waits behind this backward.
  averaged_outputs_.clear();
  if (deferred_no_sync_active_ > 0) averaged_outputs_ = armed_outputs_reached();
  if (walked_) {
    const auto reached = reachable_leaves();
    for (size_t i = 0; i < params_.size(); ++i)
      unused_[i] = reached.count(params_[i].second.impl_ptr()) == 0;
  }
  if (options_.find_unused_parameters) {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (unused_[i]) mark_ready(i, false);
    }
  }
}

const Join* Reducer::active_join() const {
  return options_.divide_by_initial_world_size ? nullptr : Join::current(group_);
}

// The world size; under a Join over this group, the ranks with a real batch
// this iteration, unless divide_by_initial_world_size. Joined ranks add zero
// gradients, so this makes the average the one over the active ranks' samples.
// After no_sync() iterations, whose sums this backward averages too, the
// mean of each iteration's count: the active ranks' batches over all of them,
// per iteration, as the world size is without a Join.
double Reducer::divisor() const {
  const Join* join = active_join();
  if (!join) return group_.size();
  return static_cast<double>(window_active_ + join->active_ranks()) /
         static_cast<double>(window_steps_ + 1);
}

// Puts this rank's gradient into the bucket, scaled by 1/divisor(): its
// .grad, which holds this backward's gradient when `used`, and otherwise
// (find_unused_parameters, not reached from the output) what earlier
// backward passes left there -- the sum accumulated under no_sync(), or a
// .grad not zeroed since the last step -- which is as much this rank's
// share of the average (PyTorch copies a defined .grad of an unused
// parameter too). Zeros where .grad is undefined.
void Reducer::mark_ready(size_t param, bool used) {
  Tensor slot = slot_view(param);
  const double scale = scale_;
  const Tensor& grad = params_[param].second.grad();
  if (grad.defined()) {
    if (detail::is_view_of(grad, slot)) {  // gradient_as_bucket_view: grad is the slot
      // If no rank has used it since the last average, finalize() leaves
      // .grad as it was: keep those values, which the reduction overwrites.
      if (!used && locally_used_[param] == 0) kept_grads_[param] = grad.clone();
      if (scale != 1.0) slot.mul_(scale);
    } else {
      runtime::scale_into(slot, grad, scale);
    }
  } else {
    slot.zero_();
    // Whatever no_sync() accumulated was dropped (zero_grad(set_to_none)).
    locally_used_[param] = 0;
  }
  if (used) {
    locally_used_[param] = 1;
    ready_order_.push_back(param);
  }
  ready_[param] = true;
  ++num_ready_;
  if (--buckets_[slots_[param].bucket].pending == 0) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    Bucket& b = buckets_[next_launch_];
    b.view = std::make_unique<GradBucket>(
        GradBucket{.index = static_cast<int>(next_launch_), .buffer = b.buffer, .group = group_});
    for (size_t p : b.members) {
      b.view->parameters.push_back(params_[p].second);
      b.view->names.push_back(params_[p].first);
    }
    if (next_launch_ == 0) stats_.ready_at_first_launch = static_cast<int64_t>(num_ready_);
    b.launched_at = Clock::now();
    try {
      b.result = comm_hook_(*b.view);
    } catch (...) {
      abandon_buffer(b);
      throw;
    }
    LOCKSTEP_CHECK(b.result.work != nullptr,
                   "the communication hook returned no Work for bucket {}; return the Work of "
                   "the collective it started",
                   next_launch_);
    if (timeline_) timeline_->bucket_launched(next_launch_, *b.result.work);
    stats_.bucket_bytes.push_back(b.buffer.numel() * static_cast<int64_t>(b.buffer.element_size()));
    ++next_launch_;
  }
}

// A hook that throws may have started a collective on the bucket's buffer
// first, one that drain_and_reset() cannot wait for: it would sum into
// whatever the buffer holds when it runs, the next iteration's gradients too.
// The bucket takes a new buffer, and the gradients that are views of the old
// one (gradient_as_bucket_view) copies of their own.
void Reducer::abandon_buffer(Bucket& b) {
  abandoned_.emplace_back();
  renew_buffer(b, abandoned_.back());
}

// Moves the bucket's buffer to `keep_old` and gives it a new one, and each
// .grad that is a view of the old one (gradient_as_bucket_view) a copy.
void Reducer::renew_buffer(Bucket& b, Tensor& keep_old) {
  runtime::NoGradGuard no_grad;
  Tensor fresh = new_bucket_buffer(b.buffer.numel(), b.buffer.dtype(), b.buffer.device());
  fresh.fill_(0);
  for (size_t p : b.members) {
    Tensor& param = params_[p].second;
    if (detail::same_storage(param.grad(), b.buffer)) param.set_grad(param.grad().clone());
  }
  keep_old = std::exchange(b.buffer, std::move(fresh));
}

// A backward that threw part-way (in an autograd node, a hook, the loss's
// backward) never reaches finalize(); the next forward waits for the buckets
// it launched (drain_and_reset). Until then their all-reduces may still write
// into their buffers: into .grad where it is a bucket view, which the caller
// zeroes (zero_grad(set_to_none=false)) to skip the batch, and the next
// backward would add this one's average to its own. Those buckets take new
// buffers now. Runs while the exception unwinds: it must not throw or wait.
void Reducer::backward_failed() noexcept {
  try {
    for (Bucket& b : buckets_)
      if (b.result.work && !b.retired.defined()) renew_buffer(b, b.retired);
  } catch (const std::exception& e) {
    fmt::print(stderr,
               "lockstep: DistributedDataParallel on rank {}: after a failed backward, could "
               "not give the buckets still being reduced new buffers ({}); a .grad that is a "
               "bucket view may yet receive that backward's average\n",
               group_.rank(), e.what());
  } catch (...) {
  }
}

}  // namespace lockstep::nn
