// fashion_mnist's flags that can do nothing say so instead of pretending.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "train/fashion_mnist_runs.h"

using namespace lockstep::testing;
using Catch::Contains;

TEST_CASE("fashion_mnist --sync-bn on the MLP, which has no BatchNorm, says it changes nothing",
          "[optim][example]") {
  SKIP_WITHOUT_FASHION_MNIST();
  const std::vector<std::string> quick = {"--train-samples", "256", "--test-samples", "100",
                                          "--epochs", "1", "--log-every", "1"};
  std::vector<std::string> synced = quick;
  synced.push_back("--sync-bn");
  const FashionMnistRun with = run_fashion_mnist(2, synced);
  const FashionMnistRun without = run_fashion_mnist(2, quick);
  INFO(with.result.output);
  REQUIRE(with.result.ok());
  REQUIRE(without.result.ok());
  CHECK_THAT(with.result.output,
             Contains("note: --sync-bn changes nothing: the mlp has no BatchNorm layer") &&
                 !Contains("SyncBatchNorm"));
  CHECK_FALSE(with.digest.empty());
  CHECK(with.digest == without.digest);
}
