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

TEST_CASE("fashion_mnist --optimizer adamw --weight-decay 0 trains without weight decay",
          "[optim][example]") {
  SKIP_WITHOUT_FASHION_MNIST();
  // 0 used to mean "AdamW's default 1e-2", so weight decay could not be turned off.
  const std::vector<std::string> quick = {"--train-samples", "256", "--test-samples", "100",
                                          "--epochs",        "1",   "--optimizer",    "adamw"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = quick;
    args.insert(args.end(), extra.begin(), extra.end());
    FashionMnistRun run = run_fashion_mnist(1, args);
    INFO(run.result.output);
    REQUIRE(run.result.ok());
    REQUIRE_FALSE(run.digest.empty());
    return run.digest;
  };
  const std::string by_default = with({});
  CHECK(with({"--weight-decay", "0.01"}) == by_default);
  CHECK(with({"--weight-decay", "0"}) != by_default);
}
