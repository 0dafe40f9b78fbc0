#include "lockstep/nn/ddp/reducer.h"

#include <algorithm>
#include <cmath>
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
#include "lockstep/nn/join.h"
#include "lockstep/runtime/autograd/backward_callbacks.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops/scale_into.h"

namespace lockstep::nn {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

bool same_storage(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.storage() == b.storage();
}

bool is_view_of(const Tensor& grad, const Tensor& slot) {
  return same_storage(grad, slot) && grad.storage_offset() == slot.storage_offset();
}

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
    if (is_view_of(grad, slot)) {  // gradient_as_bucket_view: grad is the slot
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
    if (same_storage(param.grad(), b.buffer)) param.set_grad(param.grad().clone());
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

// Some bucket was never launched: a parameter got no gradient. Names them,
// says why and what to do, and keeps the ranks' calls in line (below).
void Reducer::fail_missing_gradients() {
  // The forward checked every flag; one cleared since (in or after it)
  // stops the gradient, and no other advice below would help.
  std::vector<std::string> missing, frozen_since;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    missing.push_back("'" + params_[i].first + "'");
    if (!params_[i].second.requires_grad()) frozen_since.push_back(missing.back());
  }
  drain_and_reset();
  const std::string what = fmt::format(
      "DistributedDataParallel on rank {}: {} parameter(s) received no gradient in this "
      "backward: {}. ",
      group_.rank(), missing.size(), fmt::join(missing, ", "));
  std::string advice;
  if (!frozen_since.empty()) {
    advice = fmt::format(
        "Of these, {} {} frozen (requires_grad set to false) since this iteration's forward "
        "checked the flags, and a frozen leaf takes no gradient; DDP averages the parameters "
        "that required grad when it was constructed. Change requires_grad between "
        "iterations, not between forward and backward, and re-wrap the module in "
        "DistributedDataParallel after changing it (on every rank alike)",
        fmt::join(frozen_since, ", "), frozen_since.size() == 1 ? "was" : "were");
  } else if (options_.find_unused_parameters && !walked_) {
    // With the option on, suggesting it would send the user in a circle:
    // the walk found these reachable, and the loss did not use them.
    advice =
        "static_graph keeps the parameters the first iteration used, and these were used "
        "then; construct DDP without static_graph if the set of parameters that the loss "
        "uses changes between iterations";
  } else {
    advice =
        "If they are not used to compute the loss in every iteration, construct DDP with "
        "DdpOptions{.find_unused_parameters = true}; if they are unused on purpose for the "
        "whole run, set requires_grad(false) on them before wrapping the model";
  }
  // Other ranks may have got every gradient and wait in the all-reduce of
  // a bucket this rank never launched, which only the group's timeout
  // would end. A barrier in its place tells at once: where every rank
  // failed alike it matches (the ranks' calls still agree, and training
  // may go on), and otherwise it mismatches that all-reduce on every rank
  // (wait_buckets names the cause there).
  if (group_.size() > 1) {
    try {
      group_.barrier()->wait();
    } catch (const collectives::CollectiveMismatch&) {
      throw Error(what + advice +
                  ". Other ranks did not stop here (they got these gradients, or stopped at "
                  "another bucket), so the group is unusable now: create a new process group "
                  "on every rank, or restart the job");
    } catch (const collectives::CollectiveError& e) {
      throw Error(what + advice + ". The group failed as well: " + e.what());
    }
  }
  throw Error(what + advice);
}

// Waits for every bucket's all-reduce and runs its hook's `then`, in bucket
// order; returns when each ran (ms after forward's end). A failure drains
// the rest first; where a `then` threw, `used_work` (the used map's
// all-reduce) is waited for too.
std::vector<std::pair<double, double>> Reducer::wait_buckets(
    const std::shared_ptr<collectives::Work>& used_work) {
  std::vector<std::pair<double, double>> intervals;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    try {
      b.result.work->wait();
    } catch (const collectives::CollectiveMismatch& e) {
      std::vector<std::string> names;
      for (const std::string& name : b.view->names) names.push_back("'" + name + "'");
      drain_and_reset();
      throw Error(fmt::format(
          "DistributedDataParallel on rank {}: the all-reduce of gradient bucket {} (parameters "
          "{}) met another collective on some rank. The usual causes: a parameter received no "
          "gradient in this backward on that rank (a branch of forward taken on some ranks "
          "only), or that rank's previous backward failed part-way (an error caught there to "
          "skip the batch) after starting some bucket all-reduces, and that rank's own error "
          "says which and what to do. {}",
          group_.rank(), i, fmt::join(names, ", "), e.what()));
    }
    if (b.result.then) {
      // One that throws must not leave the later buckets' all-reduces (and
      // the used map's) in flight, writing into their buffers -- .grad under
      // gradient_as_bucket_view -- after the caller caught the error and
      // zeroed it: every rank started them, so they end.
      try {
        b.result.then();
      } catch (...) {
        drain_and_reset();
        if (used_work) {
          try {
            used_work->wait();
          } catch (...) {  // the hook's error is the one to report
          }
        }
        throw;
      }
    }
    take_hook_output(b);
    intervals.emplace_back(
        ms_between(forward_end_, b.launched_at),
        ms_between(forward_end_, std::max(b.launched_at, b.result.work->finished_at())));
    b.result = {};
    b.view.reset();
  }
  return intervals;
}

void Reducer::finalize() {
  const auto backward_end = Clock::now();
  if (timeline_) timeline_->backward_ended();
  // The walk finds what the graph reaches; an op on the way may still pass
  // no gradient back (a custom backward that returns none for an input).
  // Such a parameter got none, as one not reached: unused, as in PyTorch,
  // whose hook sees an undefined gradient. (Frozen since forward: named below.)
  if (walked_) {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (ready_[i] || !params_[i].second.requires_grad()) continue;
      unused_[i] = true;  // static_graph keeps it so
      mark_ready(i, false);
    }
  }
  if (next_launch_ < buckets_.size()) fail_missing_gradients();
  // Which parameters got a gradient on any rank: those used nowhere keep
  // their .grad untouched. Issued after the buckets, on every rank alike.
  // With static_graph, after the first averaged backward, the kept walk says
  // (as PyTorch, which all-reduces its used map in that iteration only).
  Tensor used;
  std::shared_ptr<collectives::Work> used_work;
  std::exception_ptr used_failure;
  const bool used_known = options_.static_graph && unused_known_;
  if (options_.find_unused_parameters && !used_known) {
    used = Tensor::from_vector(locally_used_, {static_cast<int64_t>(locally_used_.size())});
    try {
      used_work = group_.allreduce(used, {.op = collectives::ReduceOp::Sum});
    } catch (const collectives::CollectiveError&) {
      // The group failed while the buckets were in flight (a bucket's
      // all-reduce met another rank's other call): their waits say why.
      used_failure = std::current_exception();
    }
  }
  // The next average counts from here (no_sync() iterations included).
  if (options_.find_unused_parameters) std::fill(locally_used_.begin(), locally_used_.end(), 0);
  auto intervals = wait_buckets(used_work);  // ms after forward's end
  if (used_failure) {
    drain_and_reset();
    std::rethrow_exception(used_failure);
  }
  std::vector<int32_t> globally_used(params_.size(), 1);
  if (used_work) {
    used_work->wait();
    globally_used = used.to_vector<int32_t>();
  } else if (used_known) {
    for (size_t i = 0; i < params_.size(); ++i) globally_used[i] = unused_[i] ? 0 : 1;
  }
  const auto waited_until = Clock::now();
  if (timeline_) timeline_->buckets_waited();
  end_iteration();
  // static_graph keeps this walk: the first one that a backward followed (a
  // forward without one, e.g. an evaluation with grad mode on, may use other
  // parameters, or run on some ranks only).
  if (walked_) unused_known_ = true;
  ++synced_iterations_;
  stats_.iteration += 1;
  stats_.backward_ms = ms_between(forward_end_, backward_end);
  stats_.comm_ms = union_length(std::move(intervals));
  stats_.exposed_comm_ms = ms_between(backward_end, waited_until);
  if (!rebuilt_) rebuild_buckets();
  write_gradients(globally_used);
}

// A hook may leave its result in bucket.buffer in place of the tensor it was
// given (as PyTorch's hooks return theirs); ignoring it would keep each
// rank's own gradients, and the replicas would drift apart.
void Reducer::take_hook_output(Bucket& b) {
  const Tensor out = b.view->buffer;
  if (out.is_same(b.buffer)) return;
  if (!out.defined() || out.numel() != b.buffer.numel() || out.device() != b.buffer.device()) {
    const size_t index = static_cast<size_t>(b.view->index);
    const std::string got =
        out.defined() ? fmt::format("a tensor of {} elements ({}, on {})", out.numel(),
                                    runtime::dtype_name(out.dtype()), out.device().str())
                      : std::string("an undefined tensor");
    const std::string holds =
        fmt::format("{} elements ({}, on {})", b.buffer.numel(),
                    runtime::dtype_name(b.buffer.dtype()), b.buffer.device().str());
    drain_and_reset();
    throw Error(fmt::format(
        "DistributedDataParallel on rank {}: the communication hook left {} in bucket.buffer "
        "of bucket {}, which holds {}. A hook must leave the bucket's reduced gradients in "
        "bucket.buffer: in the tensor it was given, or in one of as many elements on the same "
        "device (converted to the bucket's dtype)",
        group_.rank(), got, index, holds));
  }
  runtime::NoGradGuard no_grad;
  b.buffer.copy_(out.reshape(b.buffer.shape()));
}

// Once, after the first iteration: rank 0's ready order, shared with all,
// becomes the bucket order. The averaged values move to the new buckets.
void Reducer::rebuild_buckets() {
  rebuilt_ = true;
  std::vector<int64_t> order;
  std::vector<bool> listed(params_.size(), false);
  for (size_t p : ready_order_) {
    order.push_back(static_cast<int64_t>(p));
    listed[p] = true;
  }
  for (size_t p : reverse_order(params_.size())) {
    if (!listed[p]) order.push_back(static_cast<int64_t>(p));
  }
  Tensor shared = Tensor::from_vector(order, {static_cast<int64_t>(order.size())});
  if (group_.size() > 1) group_.broadcast(shared, {.root = 0})->wait();
  std::vector<size_t> new_order;
  for (int64_t p : shared.to_vector<int64_t>()) new_order.push_back(static_cast<size_t>(p));

  std::vector<Tensor> values;
  for (size_t p = 0; p < params_.size(); ++p) values.push_back(slot_view(p));
  build_buckets(new_order);
  for (size_t p = 0; p < params_.size(); ++p) slot_view(p).copy_(values[p]);
}

// Where nothing but the parameter can see its .grad (the usual case: the
// tensor autograd made in this backward after zero_grad(set_to_none)), the
// bucket's slot itself becomes .grad and the bucket gets a fresh buffer for
// the next iteration: the same values as a copy, without copying. A .grad
// that anyone else holds, or that is undefined, is written as before.
void Reducer::write_gradients(const std::vector<int32_t>& globally_used) {
  runtime::NoGradGuard no_grad;
  std::vector<bool> handed_out(buckets_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (globally_used[i] == 0) {  // no rank produced one: leave .grad as it is
      // As a bucket view it was reduced in place (the average of equal
      // values, up to rounding, or under a Join not even that): put it back.
      if (kept_grads_[i].defined()) Tensor(params_[i].second.grad()).copy_(kept_grads_[i]);
      kept_grads_[i] = Tensor{};
      continue;
    }
    kept_grads_[i] = Tensor{};
    Tensor& param = params_[i].second;
    Tensor slot = slot_view(i);
    const Tensor& grad = param.grad();
    if (options_.gradient_as_bucket_view) {
      if (!is_view_of(grad, slot)) {
        param.set_grad(slot);
      }
    } else if (same_storage(grad, slot)) {
      param.set_grad(slot.clone());
    } else if (!grad.defined() || (grad.use_count() == 1 && grad.storage().use_count() == 1)) {
      param.set_grad(slot);
      handed_out[slots_[i].bucket] = true;
    } else {
      Tensor(grad).copy_(slot);
    }
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!handed_out[b]) continue;
    const Tensor& old = buckets_[b].buffer;
    // Every slot is written again before the bucket is next reduced.
    buckets_[b].buffer = new_bucket_buffer(old.numel(), old.dtype(), old.device());
  }
}

// After an iteration that failed part-way: wait for what was launched (so no
// collective is left in flight on its buffers) and start clean.
void Reducer::drain_and_reset() {
  for (auto& b : buckets_) {
    if (!b.result.work) continue;
    try {
      b.result.work->wait();
    } catch (...) {  // reported by whoever caused the failure
    }
    b.result = {};
    b.view.reset();
    b.retired = Tensor{};
  }
  deferred_no_sync_active_ = 0;
  end_iteration();
}

// The next backward accumulates locally if a no_sync() forward came after the
// averaged one's forward; otherwise it needs a new forward.
void Reducer::end_iteration() {
  backward_started_ = false;
  armed_graph_.clear();
  armed_by_leaf_ = false;
  mode_ = deferred_no_sync_active_ > 0 ? Mode::no_sync : Mode::idle;
  if (mode_ == Mode::idle) averaged_outputs_.clear();
  uncounted_active_ = deferred_no_sync_active_;
  deferred_no_sync_active_ = 0;
}

}  // namespace lockstep::nn
