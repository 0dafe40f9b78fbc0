#include "lockstep/runtime/data/distributed_sampler.h"

#include <numeric>

#include "lockstep/runtime/error.h"
#include "lockstep/runtime/random.h"

namespace lockstep::runtime {

namespace {

void check_args(int64_t n, int rank, int world_size) {
  LOCKSTEP_CHECK(n >= 0, "DistributedSampler: dataset size must be >= 0, got {}", n);
  LOCKSTEP_CHECK(world_size >= 1,
                 "DistributedSampler: world_size must be >= 1, got {} (pass group->size())",
                 world_size);
  LOCKSTEP_CHECK(rank >= 0 && rank < world_size,
                 "DistributedSampler: rank {} is outside [0, {}) for world_size {} (pass "
                 "group->rank())",
                 rank, world_size, world_size);
}

// How many positions of the global order are dealt out: a multiple of the
// world size except for the uneven evaluation shards.
int64_t total_size(int64_t n, int world_size, const DistributedSamplerOptions& o) {
  if (o.drop_last) return n / world_size * world_size;
  if (o.pad) return (n + world_size - 1) / world_size * world_size;
  return n;
}

}  // namespace

DistributedSampler::DistributedSampler(int64_t n, int rank, int world_size,
                                       DistributedSamplerOptions options)
    : n_(n), rank_(rank), world_size_(world_size), options_(options) {
  check_args(n, rank, world_size);
}

int64_t DistributedSampler::shard_size(int64_t n, int rank, int world_size,
                                       const DistributedSamplerOptions& options) {
  check_args(n, rank, world_size);
  const int64_t total = total_size(n, world_size, options);
  // Positions rank, rank + N, ... below total.
  return total > rank ? (total - rank + world_size - 1) / world_size : 0;
}

namespace {
// The words of agreement(): the dataset size, the seed's bits, the flags.
constexpr int64_t kAgreedWords = 5;
}  // namespace

Tensor DistributedSampler::agreement() const {
  return Tensor::from_vector(
      std::vector<int64_t>{n_, static_cast<int64_t>(options_.seed), int64_t{options_.shuffle},
                           int64_t{options_.drop_last}, int64_t{options_.pad}},
      {kAgreedWords});
}

Tensor DistributedSampler::agreement_buffer() const {
  return Tensor::zeros({kAgreedWords * world_size_}, DType::i64);
}

// Compared with rank 0's, the same way on every rank, so all throw alike.
void DistributedSampler::check_agreement(const Tensor& all) const {
  const auto v = all.to_vector<int64_t>();
  for (int r = 1; r < world_size_; ++r) {
    const int64_t* mine = v.data() + r * kAgreedWords;
    LOCKSTEP_CHECK(mine[0] == v[0],
                   "DistributedSampler: rank {} was built for a dataset of {} samples, rank 0 for "
                   "{}; every rank must load the same dataset and pass its size()",
                   r, mine[0], v[0]);
    const char* flags[] = {"shuffle", "drop_last", "pad"};
    for (int f = 0; f < 3; ++f) {
      LOCKSTEP_CHECK(mine[2 + f] == v[2 + f],
                     "DistributedSampler: rank {} has {} = {}, rank 0 has {} = {}; every rank "
                     "must pass the same DistributedSamplerOptions",
                     r, flags[f], mine[2 + f] != 0, flags[f], v[2 + f] != 0);
    }
    LOCKSTEP_CHECK(v[2] == 0 || mine[1] == v[1],
                   "DistributedSampler: rank {} has seed {}, rank 0 has seed {}; every rank must "
                   "pass the same DistributedSamplerOptions::seed (not one per rank), or the "
                   "ranks shuffle differently, their shards overlap and samples are left out",
                   r, static_cast<uint64_t>(mine[1]), static_cast<uint64_t>(v[1]));
  }
}

void DistributedSampler::set_epoch(int64_t epoch) {
  LOCKSTEP_CHECK(epoch >= 0, "DistributedSampler: epoch must be >= 0, got {}", epoch);
  epoch_ = epoch;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  LOCKSTEP_CHECK(epoch >= 0, "DistributedSampler: epoch must be >= 0, got {}", epoch);
  std::vector<int64_t> order;
  if (options_.shuffle) {
    // The same generator as RandomSampler: every rank computes the same
    // permutation from (seed, epoch) alone, with no communication.
    Generator g(options_.seed + static_cast<uint64_t>(epoch));
    order = randperm(n_, g);
  } else {
    order.resize(static_cast<size_t>(n_));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  const int64_t total = total_size(n_, world_size_, options_);
  std::vector<int64_t> shard;
  shard.reserve(static_cast<size_t>(size()));
  // Position p >= n wraps to the start of the order (padding); p < n always
  // when not padding. n == 0 gives total == 0, so no division by zero.
  for (int64_t p = rank_; p < total; p += world_size_) shard.push_back(order[p % n_]);
  return shard;
}

}  // namespace lockstep::runtime
