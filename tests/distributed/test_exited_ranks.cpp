// distributed/exited_ranks.h: the launcher's record of ranks that ended early.
#include <catch2/catch.hpp>

#include <algorithm>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "lockstep/distributed/exited_ranks.h"
#include "lockstep/distributed/store/memory_store.h"

using lockstep::distributed::ExitedRank;
using lockstep::distributed::exited_ranks;
using lockstep::distributed::is_attempt_key;
using lockstep::distributed::MemoryStore;
using lockstep::distributed::record_exited_rank;

TEST_CASE("exited ranks: an attempt's keys are those under its prefix, the first's those under "
          "none but the launchers' own",
          "[store]") {
  CHECK(is_attempt_key("restart-2/lockstep/exited", 2));
  CHECK_FALSE(is_attempt_key("restart-2/lockstep/exited", 1));
  CHECK_FALSE(is_attempt_key("restart-20/x", 2));
  CHECK_FALSE(is_attempt_key("x", 2));
  CHECK(is_attempt_key("default/rank-claim/0", 0));
  CHECK(is_attempt_key("restart-x/y", 0));  // a user's key, not an attempt prefix
  CHECK_FALSE(is_attempt_key("restart-1/default/rank-claim/0", 0));
  CHECK_FALSE(is_attempt_key("lockstep-run/job-id", 0));
}

TEST_CASE("exited ranks: none recorded reads as none, without waiting", "[store]") {
  MemoryStore store;
  CHECK(exited_ranks(store).empty());
  CHECK(store.num_keys() == 0);  // reading created nothing
}

TEST_CASE("exited ranks: records written at once from several writers all arrive", "[store]") {
  MemoryStore store;
  std::vector<std::thread> writers;
  for (int w = 0; w < 4; ++w) {
    writers.emplace_back([&store, w] {
      for (int i = 0; i < 25; ++i) {
        const int rank = w * 25 + i;
        const std::string how = fmt::format("exited with code {}\n!", rank);
        record_exited_rank(store, {.rank = rank, .how = how});
      }
    });
  }
  for (auto& t : writers) t.join();
  auto all = exited_ranks(store);
  REQUIRE(all.size() == 100);
  std::sort(all.begin(), all.end(), [](const ExitedRank& a, const ExitedRank& b) {
    return a.rank < b.rank;
  });
  for (int r = 0; r < 100; ++r) {
    CHECK(all[static_cast<size_t>(r)].rank == r);
    // A line break in `how` would split its record.
    CHECK(all[static_cast<size_t>(r)].how == fmt::format("exited with code {} !", r));
  }
}
