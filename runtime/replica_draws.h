// Random draws of replicas that run at once (DataParallel's), the same on
// every run with the same seed however their threads interleave.
//
// Replicas drawing from one generator would each take the next draws as their
// threads happen to reach it, so the dropout masks would change from run to
// run. Instead, the first draw of a forward from a generator takes one region
// of `replicas` blocks from it, and replica i draws only from block i, in
// order. Activation checkpointing inside a replica records those draws; a
// forward that itself runs in a checkpoint region takes each region through
// that region's log, so the recomputation replays the forward's regions.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "lockstep/runtime/random.h"

namespace lockstep::runtime {

// The regions of one forward; shared by its replicas' threads.
class ReplicaDrawBlocks {
 public:
  // Draws one replica may take from one generator in one forward.
  static constexpr uint64_t kBlock = uint64_t{1} << 36;

  // Make it on the thread that runs the forward: regions are taken through
  // the draw log installed there (a checkpoint region's), if any.
  explicit ReplicaDrawBlocks(size_t replicas)
      : replicas_(replicas), outer_(detail::current_draw_log()) {}
  // The first of n draws from `g` for `replica`.
  uint64_t reserve(Generator& g, size_t replica, uint64_t n);
  // g is re-seeded, repositioned or destroyed: its region is dropped, so a
  // generator made later at its address (a new one per layer in a forward)
  // takes a region of its own stream.
  void forget(Generator& g, bool destroying);

 private:
  struct Region {
    const Generator* generator;
    uint64_t start;
    std::vector<uint64_t> taken;  // per replica
  };
  size_t replicas_;
  detail::DrawLog* outer_;  // called under mutex_ only
  std::mutex mutex_;
  std::vector<Region> regions_;
};

// While alive on a replica's thread, that thread's draws come from its blocks.
class ReplicaDrawScope final : public detail::DrawLog {
 public:
  ReplicaDrawScope(ReplicaDrawBlocks& blocks, size_t replica)
      : blocks_(blocks), replica_(replica), installed_(this) {}

  uint64_t reserve(Generator& g, uint64_t n) override { return blocks_.reserve(g, replica_, n); }
  void setting(Generator& g) override { blocks_.forget(g, false); }
  void destroying(Generator& g) override { blocks_.forget(g, true); }

 private:
  ReplicaDrawBlocks& blocks_;
  size_t replica_;
  detail::DrawLogScope installed_;  // last: installs this once the rest is set
};

}  // namespace lockstep::runtime
