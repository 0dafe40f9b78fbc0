#include "lockstep/runtime/replica_draws.h"

#include "lockstep/runtime/error.h"

namespace lockstep::runtime {

uint64_t ReplicaDrawBlocks::reserve(Generator& g, size_t replica, uint64_t n) {
  std::lock_guard lock(mutex_);
  Region* region = nullptr;
  for (auto& r : regions_) {
    if (r.generator == &g) region = &r;
  }
  if (!region) {
    // Replicas do not move g, so whichever draws first takes the same region.
    const uint64_t n_region = replicas_ * kBlock;
    const uint64_t start = outer_ ? outer_->reserve(g, n_region) : g.take(n_region);
    regions_.push_back({&g, start, std::vector<uint64_t>(replicas_, 0)});
    region = &regions_.back();
  }
  uint64_t& taken = region->taken[replica];
  LOCKSTEP_CHECK(n <= kBlock - taken,
                 "replica {} drew more than {} random numbers from one generator in one forward",
                 replica, kBlock);
  const uint64_t at = region->start + replica * kBlock + taken;
  taken += n;
  return at;
}

void ReplicaDrawBlocks::forget(Generator& g, bool destroying) {
  std::lock_guard lock(mutex_);
  std::erase_if(regions_, [&g](const Region& r) { return r.generator == &g; });
  if (!outer_) return;
  if (destroying)
    outer_->destroying(g);
  else
    outer_->setting(g);
}

}  // namespace lockstep::runtime
