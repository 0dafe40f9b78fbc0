#include "lockstep/runtime/threads.h"

#include <cblas.h>

#include <algorithm>
#include <mutex>
#include <set>

#include "lockstep/runtime/error.h"

namespace lockstep::runtime {
namespace {

// The count asked for and the bounds of the scopes alive on every thread:
// OpenBLAS's count is process-wide, so a scope that restored what it saw at
// its start would lift a bound another thread's scope still holds, or undo a
// count set meanwhile.
struct Limits {
  std::mutex mutex;
  int wanted = 1;  // read from OpenBLAS whenever no scope bounds it
  std::multiset<int> bounds;
};

Limits& limits() {
  static Limits* instance = new Limits();  // never destroyed: threads may outlive statics
  return *instance;
}

// Under l.mutex: OpenBLAS runs the smaller of the count asked for and the
// tightest bound.
void apply(Limits& l) {
  int n = l.wanted;
  if (!l.bounds.empty()) n = std::min(n, *l.bounds.begin());
  if (n != openblas_get_num_threads()) openblas_set_num_threads(n);
}

}  // namespace

void set_num_threads(int n) {
  LOCKSTEP_CHECK(n >= 1, "set_num_threads: need at least 1 thread, got {}", n);
  Limits& l = limits();
  std::lock_guard lock(l.mutex);
  l.wanted = n;
  apply(l);
}

int num_threads() { return openblas_get_num_threads(); }

NumThreadsAtMost::NumThreadsAtMost(int n, bool active) {
  if (!active) return;
  LOCKSTEP_CHECK(n >= 1, "NumThreadsAtMost: need at least 1 thread, got {}", n);
  Limits& l = limits();
  std::lock_guard lock(l.mutex);
  // Unbounded, OpenBLAS runs what was asked for (by its environment variables too).
  if (l.bounds.empty()) l.wanted = openblas_get_num_threads();
  l.bounds.insert(n);
  bound_ = n;
  apply(l);
}

NumThreadsAtMost::~NumThreadsAtMost() {
  if (bound_ == 0) return;
  Limits& l = limits();
  std::lock_guard lock(l.mutex);
  l.bounds.erase(l.bounds.find(bound_));
  apply(l);
}

}  // namespace lockstep::runtime
