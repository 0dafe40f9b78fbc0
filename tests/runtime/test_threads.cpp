// runtime/threads: the CPU kernels' thread count, and NumThreadsAtMost scopes
// that overlap on several threads (DataParallel's CPU replicas, run from two
// threads of the program at once) or outlive a set_num_threads.
#include <catch2/catch.hpp>

#include <optional>

#include "lockstep/runtime/threads.h"

using namespace lockstep::runtime;

namespace {

// Restores the count a case found.
struct CountGuard {
  int saved = num_threads();
  ~CountGuard() { set_num_threads(saved); }
};

}  // namespace

TEST_CASE("threads: a scope that ends first leaves another's bound in place", "[threads]") {
  CountGuard guard;
  set_num_threads(2);
  std::optional<NumThreadsAtMost> first, second;
  first.emplace(1);
  second.emplace(1);  // as another thread's DataParallel forward, started meanwhile
  first.reset();
  CHECK(num_threads() == 1);  // the second's replicas still run
  second.reset();
  CHECK(num_threads() == 2);
}

TEST_CASE("threads: a count set while a scope bounds it applies when the scope ends",
          "[threads]") {
  CountGuard guard;
  set_num_threads(2);
  {
    NumThreadsAtMost one(1);
    set_num_threads(3);  // as another thread of the program
    CHECK(num_threads() == 1);
  }
  CHECK(num_threads() == 3);
}

TEST_CASE("threads: nested and inactive scopes", "[threads]") {
  CountGuard guard;
  set_num_threads(3);
  {
    NumThreadsAtMost two(2);
    CHECK(num_threads() == 2);
    {
      NumThreadsAtMost one(1);
      NumThreadsAtMost off(1, false);
      CHECK(num_threads() == 1);
    }
    CHECK(num_threads() == 2);
  }
  CHECK(num_threads() == 3);
  CHECK_THROWS_WITH(set_num_threads(0), "set_num_threads: need at least 1 thread, got 0");
}
