// nn::DistributedDataParallel: one model replica per rank; gradients are
// averaged across ranks during backward, as PyTorch's DDP.
//
//   auto ddp = std::make_shared<nn::DistributedDataParallel>(model, group);
//   Tensor loss = loss_fn(ddp->forward(x), y);
//   loss.backward();      // buckets all-reduce while backward runs
//   opt.step();           // every rank holds the same averaged gradients
//
// Construction checks that every rank holds the same parameters and buffers
// (names, shapes, dtypes; an error names the first difference and the ranks), then
// copies rank 0's parameters and buffers to all ranks (without
// DdpOptions::broadcast_buffers, as PyTorch, the buffers are neither checked
// nor copied: each rank keeps its own). Gradients are summed
// across ranks and multiplied by 1/world_size: averaged, never left summed.
// All ranks must run forward and backward the same number of times; for
// ranks with different numbers of batches, iterate them through an nn::Join
// (join.h), under which the divisor is the ranks that had a real batch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lockstep/nn/ddp/ddp_options.h"
#include "lockstep/nn/ddp/ddp_stats.h"
#include "lockstep/nn/module.h"

namespace lockstep::nn {

class Reducer;

// Where a bucket's parameters are (for tests and printing).
struct BucketInfo {
  std::vector<std::string> names;  // in bucket order
  int64_t bytes = 0;
  DType dtype = DType::f32;
  bool in_shared_memory = false;  // DdpOptions::buckets_in_shared_memory took
};

class DistributedDataParallel : public Module {
 public:
  DistributedDataParallel(std::shared_ptr<Module> module,
                          std::shared_ptr<collectives::ProcessGroup> group, DdpOptions options = {});
  ~DistributedDataParallel() override;

  // Broadcasts buffers from rank 0 (broadcast_buffers; under a Join, from
  // Join::first_active_rank()), runs the module, and prepares the reducer
  // for the backward that follows. forward_values passes several inputs and
  // outputs through unchanged; the unused-parameter search walks back from
  // every tensor returned.
  Tensor forward(const Tensor& input) override;
  Values forward_values(const Values& inputs) override;

  Module& module() { return *module_; }
  const std::shared_ptr<Module>& module_ptr() const { return module_; }
  collectives::ProcessGroup& group() { return *group_; }
  const DdpOptions& options() const { return options_; }

  // Copies rank 0's parameters and buffers (these only with
  // broadcast_buffers) to every rank (after changing a parameter by hand on
  // one rank). Collective.
  void broadcast_parameters();

  // The backward of a forward run while the returned guard lives accumulates
  // gradients locally and communicates nothing; the first backward after a
  // forward outside it averages the sum. As PyTorch, a forward under the
  // guard leaves armed the averaging of an earlier forward outside it, while
  // any tensor of that forward's graph lives (one whose outputs are all gone
  // can never be backpropagated).
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  // Replaces the default all-reduce for every bucket. Must be registered the
  // same way on every rank, before the first backward; once.
  void register_comm_hook(CommHook hook);

  std::vector<BucketInfo> buckets() const;
  // The last completed iteration's timings.
  const DdpStats& stats() const;

  std::string type_name() const override { return "DistributedDataParallel"; }

 private:
  // Broadcasts the buffers, calls run() (which returns the output tensors),
  // and prepares the reducer.
  template <class Run>
  void run_forward(Run&& run);

  std::shared_ptr<Module> module_;
  std::shared_ptr<collectives::ProcessGroup> group_;
  DdpOptions options_;
  std::unique_ptr<Reducer> reducer_;
  bool require_sync_ = true;
  int64_t training_forwards_ = 0;  // for DdpOptions::verify_every
  std::vector<uint64_t> structure_;  // module_->structure_stamps() when wrapped
};

}  // namespace lockstep::nn
