// ZeroRedundancyOptimizer: ZeRO stage 1, as torch.distributed.optim.
// ZeroRedundancyOptimizer. Every rank keeps the whole model and the whole
// gradient (DDP averages it), but the optimizer state (momentum, Adam's
// moments) only of its own shard of the parameters: about 1/N of it each.
//
//   auto model = ...;  nn::DistributedDataParallel ddp(model, group);
//   optim::ZeroRedundancyOptimizer opt(model->parameters(), group,
//       [](std::vector<optim::ParamGroup> shard) {
//         return std::make_unique<optim::Adam>(std::move(shard), optim::AdamOptions{.lr = 1e-3});
//       });
//   loss.backward();  opt.clip_grad_norm(1.0);  opt.step();
//
// Partition (partition.h), over all groups together, every rank computing the
// same one:
//   split_parameters = true (default): the parameters of each dtype are laid
//     end to end in global order as flat elements, T in all, and rank r owns
//     elements [floor(r*T/N), floor((r+1)*T/N)) of that line. A parameter
//     crossing a boundary is cut into pieces (at most one per rank), so every
//     rank holds floor(T/N) or ceil(T/N) elements of state per dtype, however
//     large the largest layer. Adam's scalar "step" is kept once per piece.
//   split_parameters = false: whole parameters, largest first, each to the
//     least-loaded rank by bytes (as PyTorch's ZeroRedundancyOptimizer).
// The inner optimizer is built by the factory on this rank's pieces, one group
// per original group that has a piece here, each with its group's options. A
// piece that is a whole parameter is passed as the parameter itself; a cut
// one as a flat view of its range of the parameter's storage (the parameter
// must be contiguous), whose gradient is set to the same range of the
// parameter's gradient before the inner step (and dropped after). The inner
// optimizer must therefore be elementwise (SGD, Adam, AdamW: each element's
// update reads only that element's gradient and state); optimizers with
// per-tensor statistics need split_parameters = false. step() steps the
// pieces, then sends every piece from its owner to all ranks (ZeroOptions::
// Sync below), so after step() all ranks hold the same bits. A frozen
// parameter (requires_grad false) without a gradient is skipped by the inner
// optimizer and not sent (as PyTorch's with parameters_as_bucket_view): a
// fine-tuning run with a frozen backbone sends only what trains. Freezing or
// unfreezing between steps is seen at the next step(); every rank must
// freeze alike, as DDP requires.
//
// A group may hold no parameters (kept, with its options and its place in
// state_dict(), as PyTorch keeps it); every group empty is refused.
//
// Options: param_groups() lists every parameter of every group, with the full
// options (defaults filled in by the inner optimizer's type). Edit them there
// (an LR scheduler does); step() copies them into the inner optimizer first.
//
// Collective calls: the constructor, step(), clip_grad_norm(),
// consolidate_state_dict(), all_state_bytes(). Every rank must make them in
// the same order. Everything else is local.
//
// Not supported: add_param_group() after construction (throws), and moving
// or converting the parameters afterwards (Module::to): the shard's views and
// the sync buffers are made for their dtype and device, so step() and
// clip_grad_norm() refuse a parameter whose dtype or device changed. Build
// the optimizer after model.to(...).
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "lockstep/collectives/process_group.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/optim/partition.h"

namespace lockstep::optim {

using OptimizerFactory = std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroup>)>;

struct ZeroOptions {
  // How updated parameters reach every rank after step():
  //   Broadcast  one broadcast per owner bucket, from the owner; a piece of at
  //              least bucket_cap_mb goes directly (no copy), smaller ones
  //              are packed into buckets of up to bucket_cap_mb.
  //   Allgather  one all-gather per dtype of every rank's pieces packed into a
  //              flat slot (padded to the largest rank's).
  enum class Sync { Broadcast, Allgather };
  Sync sync = Sync::Broadcast;
  double bucket_cap_mb = 4.0;
  // Cut parameters so that every rank holds 1/N of the elements (see the
  // partition above); false: whole parameters only.
  bool split_parameters = true;
};

class ZeroRedundancyOptimizer : public Optimizer {
 public:
  ZeroRedundancyOptimizer(std::vector<ParamGroup> groups,
                          std::shared_ptr<collectives::ProcessGroup> group,
                          OptimizerFactory factory, ZeroOptions options = {});
  ZeroRedundancyOptimizer(std::vector<Tensor> params,
                          std::shared_ptr<collectives::ProcessGroup> group,
                          OptimizerFactory factory, ZeroOptions options = {});
  ~ZeroRedundancyOptimizer() override;

  // Steps this rank's pieces, then syncs every piece from its owner.
  // Collective.
  void step() override;

  // Clips by the global gradient norm of all parameters: the partial over
  // this rank's pieces (sum |g|^p, or max |g| for infinity; each element is
  // in exactly one rank's pieces) all-reduced, then this rank's pieces of the
  // gradients scaled in place (the only gradient elements its step reads;
  // others are left as they are). A gradient that is not contiguous is first
  // replaced by a contiguous copy. Gradients must be equal on all ranks (DDP makes them so). Returns
  // the total norm; see clip_grad.h for the rule. Collective.
  double clip_grad_norm(double max_norm, double norm_type = 2.0, bool error_if_nonfinite = false);

  // Gathers the full state onto rank `to`: PyTorch-shaped, parameters
  // numbered 0, 1, ... across the original groups in order. The pieces of a
  // cut parameter are stitched back: elementwise state into one tensor of the
  // parameter's shape, a 0-dim entry (Adam's "step", equal in every piece)
  // taken once. Collective.
  void consolidate_state_dict(int to = 0);
  // On rank `to` after consolidate_state_dict(to): the full state (the last
  // consolidation; call it again after more steps). Elsewhere, or before:
  // throws. The tensors are copies.
  OptimizerState state_dict() const override;
  // Takes a full state (from state_dict(), or of the plain optimizer over the
  // same groups); keeps this rank's pieces of it (elementwise state cut to
  // each piece's range, 0-dim entries copied). Every entry is first checked
  // on every rank against its whole parameter (check_state_entry in
  // optimizer.h, the inner optimizer's rule), so the ranks refuse a state
  // alike. On every rank; local.
  void load_state_dict(const OptimizerState& full) override;

  // The inner optimizer's rule.
  void check_state_keys(std::string_view what, int64_t index,
                        const std::map<std::string, Tensor>& entries) const override;
  void add_param_group(ParamGroup group) override;  // throws: not supported

  // Bytes of this rank's optimizer state tensors (every piece's; a cut
  // parameter's 0-dim entries count once per piece).
  int64_t local_state_bytes() const;
  // Every rank's local_state_bytes(), by rank. Collective.
  std::vector<int64_t> all_state_bytes() const;

  const Partition& partition() const { return partition_; }
  // This rank's pieces, in global order, and the tensors the inner optimizer
  // steps for them (the parameter, or a flat view of its range); both empty
  // when this rank owns nothing.
  const std::vector<Piece>& local_pieces() const { return local_pieces_; }
  const std::vector<Tensor>& local_params() const { return local_params_; }
  Optimizer* inner() { return inner_.get(); }  // null when this rank owns nothing
  // The inner optimizer's type ("Adam", ...), on every rank, owner or not.
  const std::string& inner_name() const { return probe_->name(); }
  collectives::ProcessGroup& process_group() { return *group_; }

 protected:
  void validate(const GroupOptions& options) const override;

 private:
  struct Bucket;
  void check_same_parameters_on_every_rank(const std::vector<ParamGroup>& groups) const;
  void check_not_moved(const char* what) const;
  void build_shard();
  bool is_whole(const Piece& piece) const;
  Tensor data_of(const Piece& piece) const;
  void bind_grads();
  void release_grads();
  OptimizerState probe_state(const std::function<const GroupOptions&(size_t)>& options_of) const;
  void sync_options();
  void sync_parameters();
  std::vector<bool> changeable() const;
  void plan_sync();

  std::shared_ptr<collectives::ProcessGroup> group_;
  OptimizerFactory factory_;
  ZeroOptions options_;
  std::vector<Tensor> all_params_;   // global order
  std::vector<std::pair<runtime::DType, runtime::Device>> placed_;  // each one's at construction
  Partition partition_;              // over all_params_
  std::vector<Piece> local_pieces_;  // inner's parameter i -> its piece
  std::vector<Tensor> local_params_; // inner's parameter i
  std::vector<size_t> outer_of_inner_;  // inner group -> outer group
  std::unique_ptr<Optimizer> inner_;         // null when this rank owns nothing
  // One scalar per group, same type as the inner optimizer: fills in and
  // validates options identically on every rank, shard or no shard.
  std::unique_ptr<Optimizer> probe_;
  std::vector<Bucket> buckets_;
  std::vector<bool> sent_;  // by global index: whether buckets_ send its pieces
  std::unique_ptr<OptimizerState> consolidated_;
  int consolidated_on_ = -1;
};

}  // namespace lockstep::optim
