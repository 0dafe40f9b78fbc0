#include <catch2/catch.hpp>

#include "lockstep/nn/ddp/bucket_plan.h"
#include "support/test_util.h"

using lockstep::nn::assign_buckets;
using lockstep::nn::BucketParam;
using lockstep::nn::reverse_order;
using lockstep::runtime::DType;

namespace {
BucketParam f32(int64_t bytes) { return {.bytes = bytes, .dtype = DType::f32}; }
}  // namespace

TEST_CASE("bucket plan: reverse registration order, small first bucket, then the cap",
          "[ddp][buckets]") {
  // Six parameters of 400 bytes; first cap 500 bytes, then 1000.
  std::vector<BucketParam> params(6, f32(400));
  const auto buckets = assign_buckets(params, reverse_order(6), 500, 1000);
  // 5,4 close the first bucket (800 >= 500); 3,2,1 close the next (1200 >= 1000); 0 is left.
  REQUIRE(buckets == std::vector<std::vector<size_t>>{{5, 4}, {3, 2, 1}, {0}});
}

TEST_CASE("bucket plan: one parameter larger than the cap gets its own bucket", "[ddp][buckets]") {
  std::vector<BucketParam> params{f32(100), f32(5000), f32(100)};
  const auto buckets = assign_buckets(params, reverse_order(3), 150, 1000);
  REQUIRE(buckets == std::vector<std::vector<size_t>>{{2, 1}, {0}});
}

TEST_CASE("bucket plan: dtypes never share a bucket; buckets keep the ready order",
          "[ddp][buckets]") {
  std::vector<BucketParam> params{f32(100), {.bytes = 100, .dtype = DType::f64}, f32(100),
                                  {.bytes = 100, .dtype = DType::f64}};
  const auto buckets = assign_buckets(params, reverse_order(4), 1 << 20, 1 << 20);
  // Neither dtype fills a bucket: one per dtype, ordered by first member (3 before 2).
  REQUIRE(buckets == std::vector<std::vector<size_t>>{{3, 1}, {2, 0}});
}

TEST_CASE("bucket plan: a custom order (rank 0's observed one) is followed", "[ddp][buckets]") {
  std::vector<BucketParam> params(4, f32(600));
  const auto buckets = assign_buckets(params, {1, 3, 0, 2}, 500, 1000);
  REQUIRE(buckets == std::vector<std::vector<size_t>>{{1}, {3, 0}, {2}});
}

TEST_CASE("bucket plan: bad orders and caps are refused with a reason", "[ddp][buckets]") {
  std::vector<BucketParam> params(3, f32(4));
  REQUIRE_THAT(lockstep::testing::error_of([&] { assign_buckets(params, {0, 0, 1}, 1, 1); }),
               Catch::Contains("not a permutation"));
  REQUIRE_THAT(lockstep::testing::error_of([&] { assign_buckets(params, {0, 1}, 1, 1); }),
               Catch::Contains("lists 2 parameters, there are 3"));
  REQUIRE_THAT(lockstep::testing::error_of([&] { assign_buckets(params, {0, 1, 2}, 0, 1); }),
               Catch::Contains("bucket_cap_mb"));
}
