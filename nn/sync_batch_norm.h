// SyncBatchNorm: batch normalisation with the statistics of the global batch
// (every rank's local batch together), as torch.nn.SyncBatchNorm.
//
// Training, world size > 1 -- two collectives per step, both on `group`:
//   forward   one all-gather of each rank's packed [mean | var | count] (f64);
//             the global mean and variance are combined from them with the
//             per-rank counts (Chan et al.: no E[x^2] - E[x]^2 cancellation),
//             so uneven local batches are exact and a rank with an empty
//             batch (N = 0) contributes count 0 but still takes part.
//   backward  one all-reduce (sum) of packed [sum(dy) | sum(dy * (x - mean))]
//             per channel, then the usual input gradient with the global
//             count. Weight and bias gradients stay local: DDP averages them.
// Running statistics are updated identically on every rank (unbiased global
// variance, momentum or the cumulative average as BatchNorm).
//
// CPU and CUDA tensors, f32 and f64; the module's parameters and buffers on
// the input's device. On CUDA the packed buffers are f64 tensors on that
// device (NCCL takes them as they are; gloo, shm and mpi stage them through
// host memory), and statistics, running statistics and gradients are
// computed there, queued on the current stream. The host waits for the
// device only where this rank's batch has at most one value per channel, to
// read the global count for the check below.
//
// Eval mode, world size 1 or no group: exactly BatchNorm, no communication.
// Every rank must call forward (and backward) the same number of times, as
// with any collective, including ranks whose local batch is empty.
#pragma once

#include <memory>

#include "lockstep/collectives/process_group.h"
#include "lockstep/nn/normalization.h"

namespace lockstep::nn {

class SyncBatchNorm : public BatchNormBase {
 public:
  // Input [N, C], [N, C, L], [N, C, H, W] (any [N, C, ...]). A null group
  // means no synchronisation (BatchNorm).
  SyncBatchNorm(int64_t num_features, std::shared_ptr<collectives::ProcessGroup> group,
                BatchNormOptions options = {});

  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "SyncBatchNorm"; }
  // For DataParallel: a SyncBatchNorm on the same group. Refused for a group
  // of more than one rank, whose collectives the replicas' threads would
  // enter at once (use DistributedDataParallel, one device per process).
  std::shared_ptr<Module> replicate() const override;

  const std::shared_ptr<collectives::ProcessGroup>& group() const { return group_; }

 protected:
  void check_input_dim(const Tensor& input) const override;

 private:
  std::shared_ptr<collectives::ProcessGroup> group_;
};

// `module` with every BatchNorm1d/2d in its tree (itself included) replaced by
// a SyncBatchNorm on `group`, and every SyncBatchNorm on no group or another
// by one on `group` (so that it synchronises over `group`, as in PyTorch),
// with the same options, mode, dtype, parameter and buffer values, and
// requires_grad flags, under the same name, so state_dict() keys and values
// are unchanged; a SyncBatchNorm already on `group` stays as it is. Returns
// the new root when `module` itself is replaced, else `module`, changed in
// place. The new modules hold copies: build the optimizer from the converted
// model. A BatchNorm registered under several names (or shared by several
// parents) becomes one SyncBatchNorm, shared the same way. Modules that keep
// typed pointers to their children (ResNet's bn1, Checkpoint's module) have
// them bound (Module::bind_child), so their forward runs the SyncBatchNorm; a
// module of your own that calls a BatchNorm child through a field of its own
// must bind it too, and a field whose type a SyncBatchNorm is not
// (BatchNorm2d rather than BatchNormBase) makes the conversion fail with an
// error naming it, before that child is changed.
std::shared_ptr<Module> convert_sync_batchnorm(std::shared_ptr<Module> module,
                                               std::shared_ptr<collectives::ProcessGroup> group);

}  // namespace lockstep::nn
