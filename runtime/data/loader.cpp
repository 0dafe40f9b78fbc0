#include "lockstep/runtime/data/loader.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <span>

#include "lockstep/runtime/error.h"

namespace lockstep::runtime {

namespace {

std::unique_ptr<Sampler> default_sampler(const Dataset& dataset, const DataLoaderOptions& o) {
  if (o.shuffle) return std::make_unique<RandomSampler>(dataset.size(), o.seed);
  return std::make_unique<SequentialSampler>(dataset.size());
}

DataLoaderOptions carried_by_sampler(DataLoaderOptions o) {
  o.shuffle = false;  // now carried by the sampler
  o.seed = 0;
  return o;
}

}  // namespace

DataLoader::DataLoader(const Dataset& dataset, DataLoaderOptions options)
    : DataLoader(dataset, default_sampler(dataset, options), carried_by_sampler(options)) {}

DataLoader::DataLoader(const Dataset& dataset, std::unique_ptr<Sampler> sampler,
                       DataLoaderOptions options)
    : dataset_(&dataset), sampler_(std::move(sampler)), options_(options) {
  LOCKSTEP_CHECK(sampler_ != nullptr, "DataLoader: sampler is null");
  LOCKSTEP_CHECK(options_.batch_size >= 1, "DataLoader: batch_size must be >= 1, got {}",
                 options_.batch_size);
  LOCKSTEP_CHECK(!options_.shuffle,
                 "DataLoader: shuffle is set but a sampler was given; the sampler decides the "
                 "order (use a RandomSampler, or leave shuffle false)");
  LOCKSTEP_CHECK(options_.seed == 0,
                 "DataLoader: seed {} is set but a sampler was given, whose own seed decides the "
                 "order (DistributedSamplerOptions::seed, RandomSampler(n, seed)); give the seed "
                 "to the sampler and leave the loader's 0",
                 options_.seed);
  const int64_t built_for = sampler_->dataset_size();
  LOCKSTEP_CHECK(built_for < 0 || built_for == dataset.size(),
                 "DataLoader: the sampler was built for a dataset of {} samples, but the dataset "
                 "holds {}; build it with dataset.size() (with fewer, every epoch would leave "
                 "samples out)",
                 built_for, dataset.size());
  // A sampler that keeps an epoch was maybe given one already (PyTorch's
  // sampler.set_epoch before the loop): start there, not at 0.
  set_epoch(std::max<int64_t>(sampler_->held_epoch(), 0));
}

void DataLoader::set_epoch(int64_t epoch) {
  LOCKSTEP_CHECK(epoch >= 0, "DataLoader: epoch must be >= 0, got {}", epoch);
  std::vector<int64_t> order = sampler_->indices(epoch);
  // A Sampler is the caller's own class too: a size() that disagrees with
  // its indices is their bug, named as such.
  LOCKSTEP_CHECK(static_cast<int64_t>(order.size()) == sampler_->size(),
                 "DataLoader: the sampler gave {} indices for epoch {}, but its size() is {}",
                 order.size(), epoch, sampler_->size());
  const int64_t n = dataset_->size();
  for (int64_t i : order)
    LOCKSTEP_CHECK(i >= 0 && i < n, "DataLoader: the sampler gave index {} for a dataset of {}",
                   i, n);
  sampler_->set_epoch(epoch);
  order_ = std::move(order);
  epoch_ = epoch;
  pass_finished_ = false;
}

int64_t DataLoader::num_batches() const {
  const int64_t n = static_cast<int64_t>(order_.size());
  const int64_t b = options_.batch_size;
  // Not (n + b - 1) / b: that overflows for a batch_size near the largest int64_t.
  return n / b + (!options_.drop_last && n % b != 0 ? 1 : 0);
}

int64_t DataLoader::num_samples() const {
  const int64_t n = static_cast<int64_t>(order_.size());
  return options_.drop_last ? n / options_.batch_size * options_.batch_size : n;
}

Batch DataLoader::batch(int64_t i) const {
  LOCKSTEP_CHECK(i >= 0 && i < num_batches(), "DataLoader: batch {} is out of range [0, {})", i,
                 num_batches());
  // The order was drawn for epoch_: a sampler told of another epoch by its
  // own set_epoch would otherwise see its new epoch silently ignored.
  const int64_t held = sampler_->held_epoch();
  LOCKSTEP_CHECK(held < 0 || held == epoch_,
                 "DataLoader: its sampler's set_epoch({}) was called, but the loader still "
                 "batches epoch {}'s order; call loader.set_epoch({}) instead (it chooses the "
                 "epoch for the loader and passes it to the sampler)",
                 held, epoch_, held);
  std::atomic_ref pass_finished(pass_finished_);
  if (i == 0 && pass_finished.load(std::memory_order_relaxed)) report_repeated_order();
  if (i == num_batches() - 1) pass_finished.store(true, std::memory_order_relaxed);
  const int64_t begin = i * options_.batch_size;  // at most the epoch's size
  const int64_t count =
      std::min(options_.batch_size, static_cast<int64_t>(order_.size()) - begin);
  return dataset_->get_batch(std::span<const int64_t>(order_).subspan(
      static_cast<size_t>(begin), static_cast<size_t>(count)));
}

// PyTorch's most asked-about shuffle: without set_epoch every epoch repeats
// the first one's order (on every rank, under a DistributedSampler), and
// nothing says so. A second pass over one epoch's order may be meant (a
// sampler whose order does not change with the epoch loses nothing), so this
// warns once per loader instead of refusing.
void DataLoader::report_repeated_order() const {
  if (std::atomic_ref(repeat_reported_).exchange(true)) return;
  if (sampler_->indices(epoch_ + 1) == order_) return;
  std::fprintf(stderr,
               "lockstep: warning: DataLoader: a new pass over its batches began without "
               "set_epoch(), so it repeats epoch %lld's shuffled order; call "
               "loader.set_epoch(epoch) before each epoch for a new order (as PyTorch's "
               "DistributedSampler needs sampler.set_epoch). Said once per loader.\n",
               static_cast<long long>(epoch_));
}

}  // namespace lockstep::runtime
