// Threads used by the CPU kernels (OpenBLAS). lockstep runs one rank per core
// slot, so programs usually want 1 (ranks, not threads, use the cores).
#pragma once

namespace lockstep::runtime {

// The count CPU kernels use (n >= 1), from now on, but below the bound of
// any NumThreadsAtMost alive, on any thread, which then holds until it ends.
void set_num_threads(int n);
// The count CPU kernels use now (any NumThreadsAtMost's bound included).
int num_threads();

// While alive, CPU kernels use at most `n` threads: for work that runs CPU
// kernels on several threads of its own at once (DataParallel's CPU replicas,
// forward and backward). Scopes on several threads overlap safely: the count
// goes back to the one last set once no scope bounds it. Inactive: does
// nothing.
class NumThreadsAtMost {
 public:
  NumThreadsAtMost(int n, bool active = true);
  ~NumThreadsAtMost();
  NumThreadsAtMost(const NumThreadsAtMost&) = delete;
  NumThreadsAtMost& operator=(const NumThreadsAtMost&) = delete;

 private:
  int bound_ = 0;  // 0: inactive
};

}  // namespace lockstep::runtime
