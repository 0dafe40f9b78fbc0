#include "lockstep/nn/ddp/distributed_data_parallel.h"

#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "lockstep/nn/ddp/reducer.h"
#include "lockstep/nn/ddp/replica_sync.h"
#include "lockstep/nn/detail/collective_context.h"
#include "lockstep/nn/join.h"
#include "lockstep/runtime/autograd/checkpoint.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/error.h"

namespace lockstep::nn {

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<Module> module,
                                                 std::shared_ptr<collectives::ProcessGroup> group,
                                                 DdpOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(options) {
  LOCKSTEP_CHECK(module_ != nullptr, "DistributedDataParallel: the module is null");
  LOCKSTEP_CHECK(group_ != nullptr,
                 "DistributedDataParallel: the process group is null; create one with "
                 "collectives::init_process_group()");
  LOCKSTEP_CHECK(options_.verify_every >= 0,
                 "DistributedDataParallel: verify_every must be >= 0 (0: never), got {}",
                 options_.verify_every);
  // Any finite positive size goes: the reducer rounds it to at least one byte
  // and at most INT64_MAX bytes.
  using Cap = std::pair<const char*, double>;
  for (const auto& [name, mb] : {Cap{"bucket_cap_mb", options_.bucket_cap_mb},
                                 Cap{"first_bucket_cap_mb", options_.first_bucket_cap_mb}}) {
    LOCKSTEP_CHECK(std::isfinite(mb) && mb > 0,
                   "DistributedDataParallel: {} must be a finite positive number of MiB, got {}",
                   name, mb);
  }
  // As PyTorch: the wrapped model's names gain a "module." prefix.
  register_module("module", module_);
  // Its buckets are built from this module's parameters below: a module put
  // in its place would train without averaging.
  freeze_child("module",
               "DistributedDataParallel's gradient buckets are built from the wrapped module's "
               "parameters; change the model (convert_sync_batchnorm included) before wrapping it, "
               "or wrap the new one in a new DistributedDataParallel");
  const auto named = module_->named_parameters();
  verify_same_parameters(named, *group_);
  // As PyTorch: without broadcast_buffers each rank keeps its own buffers,
  // from the start too (statistics of its own data, of any size).
  if (options_.broadcast_buffers) verify_same_buffers(module_->named_buffers(), *group_);
  broadcast_parameters();
  std::vector<std::pair<std::string, Tensor>> trained, frozen;
  for (const auto& [name, p] : named) {
    (p.requires_grad() ? trained : frozen).emplace_back(name, p);
  }
  // As PyTorch: with nothing to train there is nothing to average, and a
  // wrapper that only broadcasts is more likely a mistake than a choice.
  LOCKSTEP_CHECK(!trained.empty(),
                 "DistributedDataParallel: the module has no parameter that requires a gradient "
                 "({} parameters, all frozen or none), so DDP has nothing to average; call the "
                 "module directly, or wrap the part of the model that trains",
                 named.size());
  reducer_ = std::make_unique<Reducer>(std::move(trained), std::move(frozen), *group_, options_);
  structure_ = module_->structure_stamps();
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::broadcast_parameters() {
  std::vector<Tensor> tensors = module_->parameters();
  if (options_.broadcast_buffers)
    for (const Tensor& b : module_->buffers()) tensors.push_back(b);
  broadcast_coalesced(tensors, *group_, 0);
}

template <class Run>
void DistributedDataParallel::run_forward(Run&& run) {
  // Rerun by a checkpoint's recomputation in backward (the wrapped model
  // inside runtime::checkpoint): the forward prepared this iteration, and
  // the recomputed graph, which backward does not run, must not replace it.
  if (runtime::in_checkpoint_recomputation()) {
    run();
    return;
  }
  // The wrapped module's mode, which its layers follow: model->eval() on the
  // handle kept from before wrapping leaves this wrapper's own flag as it was.
  const bool training = module_->is_training();
  reducer_->settle_failed_backward(/*communicates=*/training);
  const auto start = std::chrono::steady_clock::now();
  if (training && options_.verify_every > 0 &&
      ++training_forwards_ % options_.verify_every == 0)
    verify_replicas_identical(module_->named_parameters(), *group_,
                              fmt::format("before training forward #{}", training_forwards_));
  // A submodule swapped inside the wrapped model (convert_sync_batchnorm after
  // wrapping) or a parameter registered in it would train without a bucket,
  // never averaged.
  LOCKSTEP_CHECK(module_->structure_stamps() == structure_,
                 "DistributedDataParallel on rank {}: a submodule or parameter of the wrapped "
                 "model was added or replaced after wrapping (convert_sync_batchnorm, "
                 "replace_child or register_parameter on it?); the gradient buckets hold the "
                 "parameters it had when wrapped, so new ones would train without averaging. "
                 "Change the model before wrapping it, or wrap the changed model in a new "
                 "DistributedDataParallel",
                 group_->rank());
  // A Join over another group leaves this one's divisor at its size, counting
  // the joined ranks' zero gradients, and its buffers broadcast from rank 0,
  // which may have run out of data.
  const Join* loop = Join::iterating_on_this_thread();
  LOCKSTEP_CHECK(!training || loop == nullptr || &loop->group() == group_.get(),
                 "DistributedDataParallel on rank {}: this forward runs inside an nn::Join over "
                 "group '{}', not over the group object the model is wrapped over ('{}'); DDP "
                 "averages over the ranks that still have data only under a Join over its own "
                 "group. Make the Join over the group given to DistributedDataParallel",
                 group_->rank(), loop ? loop->group().name() : "", group_->name());
  if (runtime::grad_enabled()) reducer_->forward_started();  // no_grad: no backward to time
  // Training only: in eval the buffers are read, not updated, and ranks may
  // evaluate different numbers of batches.
  if (options_.broadcast_buffers && training && group_->size() > 1) {
    const auto buffers = module_->buffers();
    // Under a Join, from a rank with a real batch: a joined rank's running
    // statistics have stopped changing, and would undo the others' updates.
    const Join* join = Join::current(*group_);
    const int root = join ? join->first_active_rank() : 0;
    // A collective in every train-mode forward: a rank that runs forward
    // alone (validation on rank 0 with the model left in train mode) waits
    // here for the others, and the timeout should say why it was waiting.
    if (!buffers.empty())
      detail::with_collective_context(
          [&] { broadcast_coalesced(buffers, *group_, root); },
          [&] {
            return fmt::format(
                "DistributedDataParallel on rank {}: the broadcast of the module's buffers from "
                "rank {}, which every forward in train mode starts (broadcast_buffers), failed",
                group_->rank(), root);
          },
          [] {
            return std::string(
                "Every rank must run each train-mode forward of a DDP model. To evaluate on "
                "some ranks only (validation on rank 0), put the model in eval mode first "
                "(ddp.eval(): an eval-mode forward communicates nothing) or call ddp.module() "
                "in eval mode, and ddp.train() before training resumes");
          });
  }
  const std::vector<Tensor> outputs = run();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  reducer_->prepare_for_backward(outputs, require_sync_, training, ms);
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  Tensor output;
  run_forward([&] {
    output = module_->forward(input);
    return std::vector<Tensor>{output};
  });
  return output;
}

Values DistributedDataParallel::forward_values(const Values& inputs) {
  Values outputs;
  run_forward([&] {
    outputs = module_->forward_values(inputs);
    return outputs.tensors();
  });
  return outputs;
}

void DistributedDataParallel::register_comm_hook(CommHook hook) {
  reducer_->register_comm_hook(std::move(hook));
}

std::vector<BucketInfo> DistributedDataParallel::buckets() const { return reducer_->bucket_info(); }

const DdpStats& DistributedDataParallel::stats() const { return reducer_->stats(); }

DistributedDataParallel::NoSyncGuard::NoSyncGuard(DistributedDataParallel& ddp)
    : ddp_(ddp), previous_(ddp.require_sync_) {
  ddp_.require_sync_ = false;
}

DistributedDataParallel::NoSyncGuard::~NoSyncGuard() { ddp_.require_sync_ = previous_; }

}  // namespace lockstep::nn
