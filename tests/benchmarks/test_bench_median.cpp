// The benchmarks' median (benchmarks/harness.h), which their tables set beside
// the PyTorch peers' statistics.median: of an even count, the mean of the two
// middle values, not the upper one.
#include <catch2/catch.hpp>

#include <vector>

#include "harness.h"

using lockstep::bench::median;

TEST_CASE("bench::median of an odd count is the middle value", "[bench][median]") {
  CHECK(median({7.0}) == 7.0);
  CHECK(median({9.0, 1.0, 5.0}) == 5.0);
  CHECK(median({4.0, 8.0, 1.0, 3.0, 100.0}) == 4.0);
}

TEST_CASE("bench::median of an even count is the mean of the middle two", "[bench][median]") {
  // Two timed iterations, one of them stalled: not the stalled one.
  CHECK(median({150.0, 3588.0}) == Approx(1869.0));
  CHECK(median({3.0, 1.0, 4.0, 2.0}) == Approx(2.5));
  CHECK(median({5.0, 5.0, 1.0, 9.0, 6.0, 2.0}) == Approx(5.0));
}

TEST_CASE("bench::median of nothing is 0", "[bench][median]") {
  CHECK(median(std::vector<double>{}) == 0.0);
}
