// Threads used by the CPU kernels (OpenBLAS). lockstep runs one rank per core
// slot, so programs usually want 1 (ranks, not threads, use the cores).
#pragma once

namespace lockstep::runtime {

void set_num_threads(int n);  // n >= 1
int num_threads();

// While alive, CPU kernels use at most `n` threads, the count before restored
// after: for work that runs CPU kernels on several threads of its own at once
// (DataParallel's CPU replicas, forward and backward). Inactive: does nothing.
class NumThreadsAtMost {
 public:
  NumThreadsAtMost(int n, bool active = true);
  ~NumThreadsAtMost();
  NumThreadsAtMost(const NumThreadsAtMost&) = delete;
  NumThreadsAtMost& operator=(const NumThreadsAtMost&) = delete;

 private:
  int previous_ = 0;  // 0: nothing to restore
};

}  // namespace lockstep::runtime
