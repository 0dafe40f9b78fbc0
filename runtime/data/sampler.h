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
};

// 0, 1, ..., n-1 in every epoch.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
};

// A permutation of 0..n-1 per epoch: randperm(n, Generator(seed + epoch)).
class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed);
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
  uint64_t seed_;
};

}  // namespace lockstep::runtime
