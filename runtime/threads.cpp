#include "lockstep/runtime/threads.h"

#include <cblas.h>

#include "lockstep/runtime/error.h"

namespace lockstep::runtime {

void set_num_threads(int n) {
  LOCKSTEP_CHECK(n >= 1, "set_num_threads: need at least 1 thread, got {}", n);
  openblas_set_num_threads(n);
}

int num_threads() { return openblas_get_num_threads(); }

NumThreadsAtMost::NumThreadsAtMost(int n, bool active) {
  if (!active || num_threads() <= n) return;
  previous_ = num_threads();
  set_num_threads(n);
}

NumThreadsAtMost::~NumThreadsAtMost() {
  if (previous_ > 0) set_num_threads(previous_);
}

}  // namespace lockstep::runtime
