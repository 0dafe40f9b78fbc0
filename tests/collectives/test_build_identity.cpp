// Ranks of different builds of lockstep in one group (build_identity.h): a
// node updated before the others, a program of one version started beside
// another's. A rank of another build is played by a thread that publishes,
// in init_process_group()'s placement exchange, what that build publishes.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "lockstep/collectives/backend_choice.h"
#include "lockstep/collectives/build_identity.h"
#include "lockstep/collectives/init.h"
#include "lockstep/config.h"
#include "lockstep/distributed/store/memory_store.h"
#include "lockstep/distributed/wire_protocol.h"
#include "support/test_util.h"

using namespace lockstep;
using Catch::Matchers::Contains;
using lockstep::testing::error_of;

namespace {

distributed::RankInfo rank_info(int rank, int size) {
  distributed::RankInfo info;
  info.rank = info.local_rank = rank;
  info.world_size = info.local_world_size = size;
  return info;
}

// Ranks 0 .. size-2 run this build's init_process_group(); the last rank
// publishes `line` as its placement, as a rank of another build would, and
// never joins a backend. Returns each real rank's error ("" for none).
std::vector<std::string> init_beside(const std::string& line, int size) {
  auto store = std::make_shared<distributed::MemoryStore>();
  const int other = size - 1;
  store->add(fmt::format("default/placement/instances/{}", other), 1);
  store->set(fmt::format("default/placement/1/{}", other),
             distributed::to_bytes(fmt::format("{} {}", size, line)));
  std::vector<std::string> errors(static_cast<size_t>(other));
  std::vector<std::thread> threads;
  for (int r = 0; r < other; ++r) {
    threads.emplace_back([&, r] {
      errors[static_cast<size_t>(r)] = error_of([&] {
        collectives::init_process_group({.backend = "shm",
                                         .timeout = std::chrono::seconds(5),
                                         .rank_info = rank_info(r, size),
                                         .store = store});
      });
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace

TEST_CASE("This build reads back from its placement line, and a line of an older build reads "
          "as one without a build",
          "[collectives][build_identity]") {
  const std::string mine = collectives::this_build();
  CHECK(collectives::is_build(mine));
  CHECK_THAT(collectives::describe_build(mine),
             Contains(fmt::format("lockstep {} wire {} (", LOCKSTEP_VERSION_STRING,
                                  distributed::kWireProtocol)) &&
                 Contains("shm"));
  collectives::PublishedPlacement entry;
  entry.asked = "gloo";
  entry.placement.node = "node a";
  entry.build = mine;
  const auto back = collectives::parse_placement(collectives::format_placement(entry));
  CHECK(back.build == mine);
  CHECK(back.asked == "gloo");
  CHECK(back.placement.node == "node a");
  // What lockstep published before wire protocol 1: no build word.
  const auto old = collectives::parse_placement("- cpu - host-b:1234");
  CHECK(old.build.empty());
  CHECK(old.asked.empty());
  CHECK(old.placement.node == "host-b:1234");
}

TEST_CASE("Ranks of different builds are refused, naming each build with its ranks and nodes",
          "[collectives][build_identity]") {
  const std::string mine = collectives::this_build();
  const std::string older = "lockstep/0.0.9/wire0/gloo,shm";
  collectives::require_same_build({mine, mine}, {"a", "b"}, "g", true);
  const std::string e = error_of([&] {
    collectives::require_same_build({mine, mine, older, older}, {"a", "a", "b", "c"}, "g", false);
  });
  CHECK_THAT(e, Contains("group 'g': its ranks run builds of lockstep that cannot be paired "
                         "(another wire protocol)") &&
                    Contains(fmt::format("ranks 0, 1 (node a) run {}",
                                         collectives::describe_build(mine))) &&
                    Contains("ranks 2, 3 (nodes b, c) run lockstep 0.0.9 wire 0 (gloo, shm)") &&
                    Contains("Run the same build on every node"));
  // Other backends built in (a CPU-only build beside one with NCCL): refused
  // where the default backend is chosen, which they would choose apart.
  CHECK_THAT(error_of([&] {
               collectives::require_same_build({mine, mine + ",nccl"}, {"a", "b"}, "g", true);
             }),
             Contains("rank 1 (node b) runs") && Contains("nccl)"));
  collectives::require_same_build({mine, mine + ",nccl"}, {"a", "b"}, "g", false);
  // Another version of the same protocol pairs.
  const std::string wire = fmt::format("/wire{}/", distributed::kWireProtocol);
  const std::string other_version =
      "lockstep/9.9.9" + mine.substr(mine.find(wire));
  collectives::require_same_build({mine, other_version}, {"a", "b"}, "g", true);
  CHECK_THAT(
      error_of([&] { collectives::require_same_build({mine, ""}, {"a", "b"}, "g", false); }),
      Contains("rank 1 (node b) runs a lockstep from before wire protocol 1"));
}

TEST_CASE("init_process_group fails at once on every rank beside a rank of another build",
          "[collectives][build_identity]") {
  // Before, the ranks took an older build's placement for their own kind and
  // went on into the backend, pairing (or waiting out the timeout for) a rank
  // that reads the shared memory, the call signatures and the store keys
  // differently; a newer build's read as a backend asked for.
  for (const std::string& e :
       init_beside("lockstep/0.0.9/wire0/gloo,shm shm - - other-node", 3)) {
    CHECK_THAT(e, Contains("group 'default': its ranks run builds of lockstep that cannot be "
                           "paired") &&
                      Contains("rank 2 (node other-node) runs lockstep 0.0.9 wire 0 (gloo, shm)") &&
                      Contains("ranks 0, 1 (node "));
  }
  // A rank of a lockstep from before builds were published.
  for (const std::string& e : init_beside("shm - - other-node", 2)) {
    CHECK_THAT(e, Contains("rank 1 (node other-node) runs a lockstep from before wire protocol"));
  }
}
