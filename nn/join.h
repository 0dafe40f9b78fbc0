// nn::Join: uneven inputs, as PyTorch's torch.distributed.algorithms.Join.
// Ranks whose data has run out keep taking part in the others' steps, on an
// empty batch, until every rank is done, so ranks may hold different numbers
// of batches without a hang or a collective mismatch.
//
//   nn::Join join(*group);
//   for (const runtime::Batch& b : join.batches(loader)) {
//     Tensor loss = loss_fn(ddp->forward(b.x), b.y);   // the step, unchanged
//     loss.backward();
//     opt.step();
//   }
//
// Each iteration starts with one small all-reduce on `group`: does this rank
// still have a batch (a count, and a bit per rank: 8 bytes per 62 ranks)?
// While any rank has one, every rank gets a batch: its
// own next one or, once its data has run out, the empty batch (x and y of
// shape [0, ...one sample's shape...] with the dataset's dtypes). When no
// rank has one, all leave the loop together. A joined rank thus runs the
// same step on zero samples and issues the same collectives in the same
// order as the others -- DDP's bucket all-reduces (its gradients are zero),
// SyncBatchNorm's statistics (count 0), ZeRO's broadcasts -- and takes the
// same optimizer step, so parameters stay bitwise identical on every rank.
// (PyTorch's joined ranks shadow the collectives instead and go stale.)
// On the empty batch every layer gives an empty output and every parameter
// a zero gradient; a Mean loss is 0 (PyTorch: NaN); BatchNorm leaves its
// running statistics alone (tests/nn/test_empty_batch.cpp). The batch size
// is 0 there: code that divides by it must not.
//
// DDP over the same group object (a training forward inside a Join over
// another group is refused) divides the summed gradients by
// active_ranks(), not the world size, so the averaged gradient is the
// one-process gradient over the concatenated batches of the ranks that had
// one; after iterations under no_sync(), by the mean of their active_ranks()
// and this one's, counting those whose forward a backward followed
// (DdpOptions::divide_by_initial_world_size gives PyTorch's divisor).
//
// Contract: every rank of the group iterates its Join at the same point and
// runs the body once per batch given; leaving the loop early on one rank
// (break, an exception) leaves the others waiting in the next collective
// until its timeout. At most one Join per group object exists at a time.
// Every rank's dataset must have the same sample shapes and dtypes (checked
// every iteration, at no extra collective).
#pragma once

#include <cstdint>
#include <iterator>
#include <string>

#include "lockstep/collectives/process_group.h"
#include "lockstep/runtime/data/loader.h"

namespace lockstep::nn {

class Join {
 public:
  // `group` must outlive the Join. Throws when another Join on `group` lives.
  explicit Join(collectives::ProcessGroup& group);
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  class Batches;
  // One pass over `loader`'s current epoch, joined. Iterate it once.
  Batches batches(const runtime::DataLoader& loader) &;
  // A temporary Join would be gone before the loop's body runs.
  Batches batches(const runtime::DataLoader& loader) && = delete;
  Batches batches(const runtime::DataLoader&& loader) & = delete;

  // The ranks with a real batch in the current iteration; the world size
  // outside an iteration.
  int active_ranks() const { return in_iteration_ ? active_ : group_.size(); }
  // The lowest rank with a real batch in the current iteration; 0 outside
  // one. DDP broadcasts buffers (per-rank BatchNorm statistics) from it, as
  // a joined rank's have stopped changing.
  int first_active_rank() const { return in_iteration_ ? first_active_ : 0; }
  // Whether this rank's current batch is the empty one.
  bool joined() const { return in_iteration_ && !has_batch_; }
  collectives::ProcessGroup& group() const { return group_; }

  // The Join over `group` (this very object), or null. DDP reads its divisor here.
  static const Join* current(const collectives::ProcessGroup& group);
  // The Join whose batches this thread is iterating (the innermost loop), or
  // null. DDP refuses to run inside a Join over another group: its divisor
  // would count the joined ranks, whose gradients are zero.
  static const Join* iterating_on_this_thread();

 private:
  friend class Batches;
  // The per-iteration all-reduce: sets active_ and in_iteration_; false when
  // no rank has a batch left.
  bool agree(bool has_batch, const std::string& kind);

  collectives::ProcessGroup& group_;
  bool in_iteration_ = false;
  static constexpr int64_t kRanksPerWord = 62;  // of the agreement's bit per rank
  bool has_batch_ = false;
  int active_ = 0;
  int first_active_ = 0;
};

// The range batches() returns; refers to the Join and the loader.
class Join::Batches {
 public:
  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = runtime::Batch;
    using difference_type = std::ptrdiff_t;
    explicit Iterator(Batches* range = nullptr) : range_(range) {}
    const runtime::Batch& operator*() const { return range_->current_; }
    const runtime::Batch* operator->() const { return &range_->current_; }
    Iterator& operator++() {
      range_->advance();
      return *this;
    }
    void operator++(int) { range_->advance(); }
    bool operator==(std::default_sentinel_t) const { return range_->done_; }

   private:
    Batches* range_;
  };

  Batches(Join& join, const runtime::DataLoader& loader);
  ~Batches();
  Batches(const Batches&) = delete;  // iterators point at the range
  Batches& operator=(const Batches&) = delete;
  Iterator begin();  // the first agreement: collective
  std::default_sentinel_t end() const { return {}; }

 private:
  void advance();
  void leave_loop();

  Join* join_;
  const runtime::DataLoader* loader_;
  runtime::Batch empty_;  // the dataset's empty batch
  std::string kind_;      // its sample shapes and dtypes, for the check
  runtime::Batch current_;
  int64_t next_ = 0;      // the loader's next batch
  bool started_ = false;
  bool done_ = false;
  // Whether this range is iterating_on_this_thread(), and what was before it.
  bool in_loop_ = false;
  const Join* outer_ = nullptr;
};

}  // namespace lockstep::nn
