// The reducer's end of an iteration: waiting for the buckets' all-reduces,
// writing the averaged gradients, the unused-parameter verdict, the first
// iteration's bucket rebuild, and the reset for the next forward.
#include <algorithm>
#include <chrono>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "lockstep/collectives/work.h"
#include "lockstep/nn/ddp/bucket_plan.h"
#include "lockstep/nn/ddp/reducer.h"
#include "lockstep/nn/detail/storage_alias.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/error.h"

namespace lockstep::nn {
namespace {

double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

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
      if (!detail::is_view_of(grad, slot)) {
        param.set_grad(slot);
      }
    } else if (detail::same_storage(grad, slot)) {
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
