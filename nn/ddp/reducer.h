// DDP's reducer: gradient hooks, buckets and the end-of-backward step.
//
// Each parameter's post-accumulate-grad hook copies its gradient, times
// 1/world_size (under a Join: 1/the ranks with a real batch), into its slot
// of a flat bucket. When a bucket's last gradient
// is in, every bucket up to it that is complete is handed to the
// communication hook (an asynchronous all-reduce by default), always in
// bucket order, so every rank issues the same collectives in the same order
// while backward goes on. The first hook of a backward queues finalize(),
// which runs once backward has finished: it waits for each bucket and writes
// the averaged values into every param.grad. With find_unused_parameters (or
// static_graph, which implies it) a parameter that the backward's graph does
// not reach counts as ready at once, its slot holding the .grad it already has (from
// no_sync() backward passes, or not zeroed) or zeros (one it reaches that gets
// no gradient all the same counts so when backward ends); one that no rank
// gave a gradient since the last average keeps its .grad. After the first iteration
// the buckets are rebuilt in the order rank 0 saw gradients become ready.
// CPU buckets come from the group's shared pool where it has one, so that its
// all-reduce reads them in place.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "lockstep/nn/ddp/ddp_options.h"
#include "lockstep/nn/ddp/ddp_stats.h"
#include "lockstep/nn/ddp/device_timeline.h"
#include "lockstep/nn/ddp/distributed_data_parallel.h"

namespace lockstep::nn {

class Join;

class Reducer {
 public:
  // `params`: the parameters that require grad, with their names; `frozen`:
  // the module's other parameters. Each forward checks that this split still
  // holds and that `params` keep their dtypes and devices (the reducer hooks
  // and buckets `params` only, in buckets of those dtypes and devices).
  Reducer(std::vector<std::pair<std::string, Tensor>> params,
          std::vector<std::pair<std::string, Tensor>> frozen, collectives::ProcessGroup& group,
          DdpOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Called at the start and the end of every DDP forward. `synced` is false
  // under no_sync(). A forward without grad mode, whose outputs need no
  // gradient, or through parameters all frozen, changes nothing here: the
  // backward of the forward before it still averages.
  void forward_started();
  // Called first in every DDP forward, before any collective of it: after a
  // backward that threw part-way, waits for the bucket all-reduces it had
  // started, then checks that every rank started as many (a barrier where
  // this rank started any); throws Error if the ranks' calls no longer line up.
  // A forward that communicates nothing (eval mode: `communicates` false),
  // which one rank may run alone, leaves the check to the next one that does.
  void settle_failed_backward(bool communicates);
  // After forward: `outputs` are every tensor the module returned (whose
  // graphs a backward may come from). `training`: a train-mode forward,
  // which every rank runs alike (an eval-mode one may run on one rank).
  void prepare_for_backward(const std::vector<Tensor>& outputs, bool synced, bool training,
                            double forward_ms);
  void register_comm_hook(CommHook hook);
  std::vector<BucketInfo> bucket_info() const;
  // On CUDA over NCCL this waits for the last iteration's device times.
  const DdpStats& stats() const;

 private:
  using Clock = std::chrono::steady_clock;
  enum class Mode { idle, sync, no_sync };
  struct Bucket {
    Tensor buffer;                // flat, one dtype
    std::vector<size_t> members;  // parameter indices, in slot order
    std::vector<int64_t> offsets;
    size_t pending = 0;           // gradients not yet in
    // What the hook was given, kept until its `then` has run: a `then` may
    // refer to it (a lambda capturing the GradBucket& it was handed).
    std::unique_ptr<GradBucket> view;
    CommHookResult result;
    Clock::time_point launched_at;
    // The buffer that `result`'s collective works on, once a failed backward
    // gave the bucket a new one (backward_failed); freed when drained.
    Tensor retired;
  };
  struct Slot {
    size_t bucket = 0;
    int64_t offset = 0;
  };

  void reserve_shared_pool();
  Tensor new_bucket_buffer(int64_t numel, DType dtype, runtime::Device device) const;
  void build_buckets(const std::vector<size_t>& order);
  Tensor slot_view(size_t param) const;
  void on_gradient_ready(size_t param);
  void begin_backward();
  const Join* active_join() const;
  double divisor() const;
  void check_parameters_unchanged() const;
  void mark_ready(size_t param, bool used);
  void launch_ready_buckets();
  void abandon_buffer(Bucket& b);
  void renew_buffer(Bucket& b, Tensor& keep_old);
  void backward_failed() noexcept;
  void finalize();
  [[noreturn]] void fail_missing_gradients();
  std::vector<std::pair<double, double>> wait_buckets(
      const std::shared_ptr<collectives::Work>& used_work);
  void take_hook_output(Bucket& b);
  void rebuild_buckets();
  void write_gradients(const std::vector<int32_t>& globally_used);
  void drain_and_reset();
  void end_iteration();
  void arm(const std::vector<Tensor>& outputs);
  void agree_frozen_forward();
  std::unordered_set<const runtime::TensorImpl*> reachable_leaves() const;
  bool armed_forward_alive() const;
  std::vector<std::weak_ptr<runtime::Node>> armed_outputs_reached() const;
  void check_not_averaged_again(const std::string& name);

  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> frozen_;
  collectives::ProcessGroup& group_;
  DdpOptions options_;
  CommHook comm_hook_;
  bool hook_registered_ = false;  // comm_hook_ is the user's, not the default
  bool gradients_seen_ = false;   // a backward has reached the hooks: too late for one
  std::vector<int64_t> hook_ids_;

  std::shared_ptr<collectives::SharedTensorPool> pool_;  // of bucket buffers, if any
  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;  // per parameter
  // Buffers of buckets whose hook threw, which a collective the hook started
  // may still write into (abandon_buffer): kept while the reducer lives.
  std::vector<Tensor> abandoned_;

  // The iteration in progress.
  Mode mode_ = Mode::idle;
  bool backward_started_ = false;
  std::vector<bool> ready_;
  // find_unused_parameters: which parameters this rank gave a gradient since
  // the last averaged backward (no_sync() iterations included); cleared by
  // finalize(). All-reduced there: a parameter no rank used keeps its .grad.
  std::vector<int32_t> locally_used_;
  // gradient_as_bucket_view: the .grad (a bucket view) of a parameter that no
  // backward since the last average touched on this rank, as it was before
  // its bucket was scaled and reduced; put back if no rank used it.
  std::vector<Tensor> kept_grads_;
  // The outputs' grad_fn of the averaged forwards since the last backward
  // (and of no_sync() forwards that came while one was armed), held weakly:
  // once all are gone no backward can come from them (armed_forward_alive).
  std::vector<std::weak_ptr<runtime::Node>> armed_graph_;
  bool armed_by_leaf_ = false;         // one returned a parameter itself
  // Those of armed_graph_ that the last averaged backward went through, kept
  // while the no_sync() forwards armed with it accumulate locally after it
  // (check_not_averaged_again); pass_checked_: this backward pass was checked.
  std::vector<std::weak_ptr<runtime::Node>> averaged_outputs_;
  bool pass_checked_ = false;
  std::vector<bool> unused_;           // find_unused_parameters: not reached from backward's root
  bool unused_known_ = false;          // static_graph: kept from the first averaged backward
  bool walked_ = false;                // unused_ computed from this iteration's backward
  size_t num_ready_ = 0;
  size_t next_launch_ = 0;
  // Buckets that a failed backward had started, not yet checked across ranks
  // (settle_failed_backward).
  size_t unsettled_launches_ = 0;
  double scale_ = 1.0;                 // 1 / divisor(), fixed when backward begins
  // The no_sync() iterations since the last average: their count, and the
  // ranks with a real batch summed over them (the world size outside a Join).
  int64_t window_active_ = 0;
  int64_t window_steps_ = 0;
  // The ranks with a real batch at the last no_sync() forward, until its
  // backward's first gradient adds them to the window (0: added, or none).
  int64_t uncounted_active_ = 0;
  // The same for a no_sync() forward that came while an averaged iteration
  // waited for its backward: it becomes uncounted_active_ once that ends.
  int64_t deferred_no_sync_active_ = 0;
  std::vector<size_t> ready_order_;    // this iteration's
  Clock::time_point forward_end_;
  double forward_ms_ = 0;

  int64_t synced_iterations_ = 0;
  bool rebuilt_ = false;
  mutable DdpStats stats_;
  std::unique_ptr<DeviceTimeline> timeline_;  // parameters on a CUDA device only
};

}  // namespace lockstep::nn
