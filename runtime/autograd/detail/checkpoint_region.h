// Internal: the state of one checkpoint region (checkpoint.h), shared by the
// saved-tensor handles of the nodes recorded inside it (node.cpp).
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/autograd/checkpoint.h"
#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/random.h"

namespace lockstep::runtime {

class CheckpointRegion : public std::enable_shared_from_this<CheckpointRegion> {
 public:
  CheckpointRegion(CheckpointFn fn, const std::vector<Tensor>& inputs);

  // Forward: places for the tensors op `op` saves; returns the first. Only
  // their versions are kept (not their memory), to be checked on unpack.
  size_t add_slots(const char* op, const std::vector<Tensor>& saved);
  // Forward: notes the parameters (leaves that require grad) op `op` reads,
  // which the recomputation reads again and must find unchanged.
  void note_inputs(const char* op, const std::vector<Tensor>& inputs);
  // After the forward: the versions the recomputation must find.
  void forward_done();
  // Recomputation: throws when op `op` reads a tensor the forward read too
  // (one the function captures) that was changed in place since.
  void check_reads(const char* op, const std::vector<Tensor>& inputs) const;
  // Recomputation: the tensors op `op` saves, in the order of the forward.
  void collect(const char* op, const std::vector<Tensor>& saved);

  // Slot `slot`, recomputing the region first if needed (for `owner`'s
  // saved tensor `index`).
  Tensor unpack(size_t slot, const Node& owner, size_t index);
  void release(size_t slot);

  // Records the forward's random draws; replays them in the recomputation.
  // A draw is its generator's seed and position, not the generator object:
  // one the function creates is a new object in each run.
  struct Draw {
    uint64_t seed, n, at;
  };
  std::vector<Draw> draws;

 private:
  void recompute();
  void check_unchanged(size_t slot, const Node& owner, size_t index) const;

  std::mutex mutex_;
  CheckpointFn fn_;
  std::vector<Tensor> inputs_;  // detached
  std::vector<bool> input_requires_grad_;
  std::vector<uint64_t> input_versions_;
  AutocastState autocast_;
  std::vector<const char*> slot_ops_;  // the op that saved each slot
  // What each slot held in the forward: its storage (weak: an activation
  // the forward dropped is recomputed, so nothing can have changed it), its
  // version then, and its shape for the error.
  struct SlotOrigin {
    std::weak_ptr<Storage> storage;
    uint64_t version = 0;
    Shape shape;
  };
  std::vector<SlotOrigin> slot_origins_;
  // The parameters the forward's ops read, as they were then: one stepped
  // before backward (under autocast the ops save a cast copy, not it) would
  // be read anew by the recomputation.
  struct ReadParameter {
    const char* op;
    std::weak_ptr<Storage> storage;
    uint64_t version = 0;
    Shape shape;
  };
  std::vector<ReadParameter> read_parameters_;
  // Every other storage the forward's ops read, with its version when the
  // forward ended. The recomputation makes its own activations, so of these
  // it reads again only the ones made outside the region: the tensors the
  // function captures, which must be as the forward left them.
  std::unordered_map<const Storage*, ReadParameter> reads_;
  std::vector<SavedTensor> saved_;     // recomputed, by slot
  std::vector<bool> released_;
  bool recomputed_ = false;
  size_t collected_ = 0;  // slots filled so far by a recomputation
};

// What this thread's record() does inside a region.
struct ActiveRegion {
  std::shared_ptr<CheckpointRegion> region;
  bool recomputing = false;
};
// The thread's active region, or null.
ActiveRegion* active_checkpoint();
// The node record() gives an op in a recomputation: it only marks the output
// as requiring grad, as in the forward.
std::shared_ptr<Node> recomputed_node(const char* op);

}  // namespace lockstep::runtime
