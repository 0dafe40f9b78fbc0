// Started by lockstep-run (tests/nn/ddp/test_join_processes.cpp): the
// uneven-input run of nn/ddp/join_fixture.h as real processes. Each of the
// three ranks trains its shard (2, 4 or 7 batches) through an nn::Join, then
// checks that every rank holds the same parameter bits and that its
// parameters equal the one-process run over the active ranks' batches.
//
// Prints "join_worker rank R/3: OK (<iterations> iterations, <active counts>)"
// and exits 0, or prints "MISMATCH: ..." lines and exits 1. An exception
// exits at once, so the launcher ends the job instead of a hang.
//
// Flags: --batch-norm   per-rank BatchNorm instead of SyncBatchNorm
//        --zero         ZeroRedundancyOptimizer over SGD instead of SGD
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "lockstep/collectives/init.h"
#include "lockstep/nn/ddp/replica_sync.h"
#include "nn/ddp/join_fixture.h"

namespace lj = lockstep::testing::join;

int main(int argc, char** argv) {
  std::string who = "join_worker";
  try {
    lj::Config config;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--batch-norm") {
        config.sync_bn = false;
      } else if (arg == "--zero") {
        config.zero = true;
      } else {
        throw lockstep::Error(fmt::format(
            "join_worker: unknown flag {} (expected --batch-norm or --zero)", arg));
      }
    }
    auto group = lockstep::collectives::init_process_group();
    who = fmt::format("join_worker rank {}/{}", group->rank(), group->size());
    if (group->size() != lj::kWorld)
      throw lockstep::Error(fmt::format("run it with {} ranks", lj::kWorld));

    const lj::RankResult mine = lj::train_rank(group->rank(), group, config);
    std::vector<std::pair<std::string, lockstep::runtime::Tensor>> named;
    for (size_t i = 0; i < mine.params.size(); ++i)
      named.emplace_back(fmt::format("parameter {}", i), mine.params[i]);
    lockstep::nn::verify_replicas_identical(named, *group, "after the joined run");
    // Per-rank BatchNorm keeps each rank's own running statistics.
    const std::string found =
        lj::mismatches(mine, lj::train_reference(config), lj::kTol, config.sync_bn);
    if (!found.empty()) {
      fmt::print("{}: MISMATCH against the one-process run:\n{}", who, found);
      return 1;
    }
    fmt::print("{}: OK ({} iterations, active ranks {})\n", who, mine.active.size(),
               fmt::join(mine.active, " "));
    std::fflush(stdout);
    group->barrier()->wait();
    return 0;
  } catch (const std::exception& e) {
    fmt::print("{}: FAILED: {}\n", who, e.what());
    std::fflush(stdout);
    return 1;
  }
}
