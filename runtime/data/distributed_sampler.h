// DistributedSampler: each rank's disjoint shard of a dataset, as PyTorch's
// torch.utils.data.DistributedSampler.
//
// Every rank builds the same global order of 0..n-1 (the identity, or
// randperm(n, Generator(seed + epoch)) like RandomSampler) and takes the
// positions rank, rank + N, rank + 2N, ... of it. When n is not a multiple of
// the world size N:
//   pad (default)   the order is extended with its own first indices until
//                   every rank has ceil(n / N): a few samples are seen twice.
//   drop_last       the order is cut so every rank has floor(n / N): a few
//                   samples are not seen this epoch.
//   neither         uneven shards (the first n % N ranks get one more) with
//                   every index exactly once. Use this for evaluation: each
//                   rank counts its correct predictions and samples, then an
//                   all-reduce (sum) of [correct, count] gives the exact
//                   accuracy over the whole test set. Not for training with
//                   DDP: ranks with one batch fewer would skip a collective.
//
//   auto sampler = std::make_unique<DistributedSampler>(train.size(), *group);
//   DataLoader loader(train, std::move(sampler), {.batch_size = 64});
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     loader.set_epoch(epoch);  // a new shuffle each epoch, the same on every rank
//     ...
//   }
#pragma once

#include <concepts>
#include <cstdint>
#include <vector>

#include "lockstep/runtime/data/sampler.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

struct DistributedSamplerOptions {
  bool shuffle = true;     // randperm(n, Generator(seed + epoch)), else 0..n-1
  uint64_t seed = 0;       // must be the same on every rank
  bool drop_last = false;  // floor(n / N) per rank; wins over pad
  bool pad = true;         // ceil(n / N) per rank, repeating the first indices
};

class DistributedSampler : public Sampler {
 public:
  // n >= 0 samples; 0 <= rank < world_size.
  DistributedSampler(int64_t n, int rank, int world_size, DistributedSamplerOptions options = {});
  // This rank's shard in `group` (a collectives::ProcessGroup, or anything
  // else with rank() and size(): the data layer sits below the collectives).
  template <class Group>
    requires requires(const Group& g) {
      { g.rank() } -> std::convertible_to<int>;
      { g.size() } -> std::convertible_to<int>;
    }
  DistributedSampler(int64_t n, const Group& group, DistributedSamplerOptions options = {})
      : DistributedSampler(n, group.rank(), group.size(), options) {}
  // The same from a group that can all-gather (a collectives::ProcessGroup),
  // and collective: every rank builds its sampler at the same point among
  // the group's calls, and one all-gather of a few numbers checks that all
  // were built alike. Ranks given different dataset sizes, options, or (with
  // shuffle) seeds would deal out overlapping shards and leave samples out
  // without a word; instead every rank throws, naming both values.
  template <class Group>
    requires requires(Group& g, runtime::Tensor& out, const runtime::Tensor& in) {
      { g.rank() } -> std::convertible_to<int>;
      { g.size() } -> std::convertible_to<int>;
      g.allgather(out, in)->wait();
    }
  DistributedSampler(int64_t n, Group& group, DistributedSamplerOptions options = {})
      : DistributedSampler(n, group.rank(), group.size(), options) {
    runtime::Tensor all = agreement_buffer();
    group.allgather(all, agreement())->wait();
    check_agreement(all);
  }

  // This rank's shard of `epoch`'s global order. The epoch is the argument:
  // a DataLoader passes the one given to loader.set_epoch().
  std::vector<int64_t> indices(int64_t epoch) const override;
  // This rank's shard of epoch(), for code that drives the sampler itself.
  std::vector<int64_t> indices() const { return indices(epoch_); }
  int64_t size() const override { return shard_size(n_, rank_, world_size_, options_); }
  int64_t dataset_size() const override { return n_; }  // n, which the shards split

  // As PyTorch's set_epoch: stores the epoch indices() (no argument) uses.
  // Under a DataLoader call loader.set_epoch(e) instead: the loader owns the
  // sampler, passes its own epoch to indices(epoch) and sets this one to it;
  // a loader whose sampler's set_epoch was called behind its back refuses to
  // batch (it would repeat its old order) and says to call loader.set_epoch.
  void set_epoch(int64_t epoch) override;
  int64_t epoch() const { return epoch_; }
  int64_t held_epoch() const override { return epoch_; }

  // How many indices `rank` gets (the same for every epoch).
  static int64_t shard_size(int64_t n, int rank, int world_size,
                            const DistributedSamplerOptions& options);

  // What every rank must agree on, as i64 words; every rank's, by rank; the
  // check of those (throws on a difference).
  Tensor agreement() const;
  Tensor agreement_buffer() const;
  void check_agreement(const Tensor& all) const;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const DistributedSamplerOptions& options() const { return options_; }

 private:
  int64_t n_;
  int rank_;
  int world_size_;
  DistributedSamplerOptions options_;
  int64_t epoch_ = 0;
};

}  // namespace lockstep::runtime
