// Samplers decide which dataset indices an epoch visits, and in what order.
// The DataLoader batches whatever order its sampler gives, so sharding the
// indices across ranks (a DistributedSampler) is one more Sampler.
//
// A sampler is a pure function of the epoch: the same (arguments, epoch) give
// the same indices on every process and every run, with no hidden state.
#pragma once

#include <cstdint>
#include <vector>

namespace lockstep::runtime {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // The indices to visit in `epoch`, in order.
  virtual std::vector<int64_t> indices(int64_t epoch) const = 0;
  // How many indices indices() returns (the same for every epoch).
  virtual int64_t size() const = 0;

  // For a sampler that also keeps an epoch of its own (DistributedSampler,
  // whose set_epoch PyTorch users call): a DataLoader's set_epoch passes its
  // epoch on here, and the loader refuses to batch once held_epoch() says
  // another (the sampler's set_epoch was called, not the loader's).
  // Samplers without one keep these defaults: nothing kept, -1.
  virtual void set_epoch(int64_t /*epoch*/) {}
  virtual int64_t held_epoch() const { return -1; }

  // The size of the dataset the sampler was built for (n of the samplers
  // here), or -1 for one that does not say. A DataLoader refuses a sampler
  // built for another size: a smaller n would silently leave samples out of
  // every epoch.
  virtual int64_t dataset_size() const { return -1; }
};

// 0, 1, ..., n-1 in every epoch.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }
  int64_t dataset_size() const override { return n_; }

 private:
  int64_t n_;
};

// A permutation of 0..n-1 per epoch: randperm(n, Generator(seed + epoch)).
class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed);
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }
  int64_t dataset_size() const override { return n_; }

 private:
  int64_t n_;
  uint64_t seed_;
};

}  // namespace lockstep::runtime
