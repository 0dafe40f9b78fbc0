// DataLoader: batches a Dataset in the order a Sampler gives, one epoch at a time.
//
//   TensorDataset train = load_fashion_mnist(dir, Split::train);
//   DataLoader loader(train, {.batch_size = 64, .shuffle = true, .seed = 0});
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     loader.set_epoch(epoch);
//     for (const Batch& b : loader) { ... b.x, b.y ... }
//   }
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <vector>

#include "lockstep/runtime/data/dataset.h"
#include "lockstep/runtime/data/sampler.h"

namespace lockstep::runtime {

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;    // RandomSampler(seed) instead of SequentialSampler
  uint64_t seed = 0;       // epoch e uses randperm(N, Generator(seed + e))
  bool drop_last = false;  // drop the last batch when it is smaller than batch_size
};

class DataLoader {
 public:
  // Sequential order, or a RandomSampler(dataset.size(), seed) when shuffle.
  DataLoader(const Dataset& dataset, DataLoaderOptions options);
  // The order of `sampler`, which decides it with its own seed: a shuffle or a
  // nonzero seed in `options` is refused (the seed would be silently ignored),
  // and so is a sampler built for another size (Sampler::dataset_size).
  DataLoader(const Dataset& dataset, std::unique_ptr<Sampler> sampler, DataLoaderOptions options);
  // The loader refers to the dataset, which must outlive it: no temporaries.
  DataLoader(const Dataset&&, DataLoaderOptions) = delete;
  DataLoader(const Dataset&&, std::unique_ptr<Sampler>, DataLoaderOptions) = delete;

  // Chooses the epoch that iteration and batch() use (until called: the
  // sampler's own epoch where it keeps one, else 0), and passes it to the
  // sampler (Sampler::set_epoch). Call it before every epoch: an epoch that
  // is not set repeats the previous order (a pass that starts again after
  // taking the last batch, over an order that set_epoch would change, says
  // so once on standard error). Calling the sampler's own set_epoch instead
  // (PyTorch's way) is refused by batch().
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }

  const Dataset& dataset() const { return *dataset_; }
  int64_t num_batches() const;  // per epoch
  int64_t num_samples() const;  // per epoch, after drop_last
  // Batch i of the current epoch: fresh tensors, safe to keep.
  Batch batch(int64_t i) const;

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    Iterator() = default;
    Iterator(const DataLoader* loader, int64_t i) : loader_(loader), i_(i) {}
    Batch operator*() const { return loader_->batch(i_); }
    Iterator& operator++() { ++i_; return *this; }
    void operator++(int) { ++i_; }
    bool operator==(const Iterator& o) const { return i_ == o.i_; }

   private:
    const DataLoader* loader_ = nullptr;
    int64_t i_ = 0;
  };
  Iterator begin() const { return {this, 0}; }
  Iterator end() const { return {this, num_batches()}; }

 private:
  const Dataset* dataset_;
  std::unique_ptr<Sampler> sampler_;
  DataLoaderOptions options_;
  int64_t epoch_ = 0;
  std::vector<int64_t> order_;  // sampler_->indices(epoch_)
  // The last batch of epoch_'s order was taken; a repeated order was
  // reported. batch() sets them through std::atomic_ref: it may be called
  // from several threads at once, as before.
  mutable bool pass_finished_ = false;
  mutable bool repeat_reported_ = false;

  void report_repeated_order() const;
};

}  // namespace lockstep::runtime
