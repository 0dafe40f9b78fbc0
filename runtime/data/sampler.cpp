#include "lockstep/runtime/data/sampler.h"

#include <numeric>

#include "lockstep/runtime/error.h"
#include "lockstep/runtime/random.h"

namespace lockstep::runtime {

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  LOCKSTEP_CHECK(n >= 0, "SequentialSampler: size must be >= 0, got {}", n);
}

std::vector<int64_t> SequentialSampler::indices(int64_t /*epoch*/) const {
  std::vector<int64_t> order(static_cast<size_t>(n_));
  std::iota(order.begin(), order.end(), int64_t{0});
  return order;
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  LOCKSTEP_CHECK(n >= 0, "RandomSampler: size must be >= 0, got {}", n);
}

std::vector<int64_t> RandomSampler::indices(int64_t epoch) const {
  LOCKSTEP_CHECK(epoch >= 0, "RandomSampler: epoch must be >= 0, got {}", epoch);
  // A fresh generator per epoch, not one that carries on: the order of epoch
  // e depends only on (seed, e), so a resumed run or another rank gets it
  // without replaying earlier epochs.
  Generator g(seed_ + static_cast<uint64_t>(epoch));
  return randperm(n_, g);
}

}  // namespace lockstep::runtime
