// Node topology: which ranks share a node, from each rank's node key, and the
// exchange of those keys through the store (one thread per rank).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <climits>
#include <map>

#include "collectives/rank_threads.h"
#include "lockstep/collectives/node_topology.h"
#include "lockstep/distributed/launch_env.h"
#include "lockstep/distributed/store/memory_store.h"
#include "support/test_util.h"

namespace lc = lockstep::collectives;
namespace lt = lockstep::testing;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

namespace {

// Every rank's topology, discovered concurrently over `store`.
std::vector<lc::NodeTopology> discover_all(lockstep::distributed::Store& store,
                                           const std::vector<std::string>& keys,
                                           const std::string& name) {
  const int size = static_cast<int>(keys.size());
  std::vector<lc::NodeTopology> topologies(static_cast<size_t>(size));
  const auto errors = lt::run_ranks(size, [&](int r) {
    topologies[static_cast<size_t>(r)] =
        lc::discover_topology(store, r, size, name, keys[static_cast<size_t>(r)], 10s);
  });
  for (const auto& e : errors) REQUIRE(lt::message_of(e) == "<no exception>");
  return topologies;
}

}  // namespace

TEST_CASE("node topology: nodes numbered by first appearance, leaders, local ranks",
          "[collectives][topology]") {
  SECTION("two nodes, contiguous") {
    const auto t = lc::topology_from_keys({"a", "a", "b", "b"}, 3);
    CHECK(t.node_of_rank == std::vector<int>{0, 0, 1, 1});
    CHECK(t.nodes == 2);
    CHECK_FALSE(t.single_node());
    CHECK(t.leaders == std::vector<int>{0, 2});
    CHECK(t.node == 1);
    CHECK(t.local_rank == 1);
    CHECK(t.local_size == 2);
    CHECK(t.local_ranks == std::vector<int>{2, 3});
  }
  SECTION("not contiguous: a node is named by its lowest rank's order, not by its key") {
    const auto t = lc::topology_from_keys({"y", "x", "y", "x", "z"}, 3);
    CHECK(t.node_of_rank == std::vector<int>{0, 1, 0, 1, 2});
    CHECK(t.nodes == 3);
    CHECK(t.leaders == std::vector<int>{0, 1, 4});
    CHECK(t.node == 1);
    CHECK(t.local_rank == 1);
    CHECK(t.local_ranks == std::vector<int>{1, 3});
  }
  SECTION("uneven") {
    const auto t = lc::topology_from_keys({"a", "b", "b", "b"}, 0);
    CHECK(t.node_of_rank == std::vector<int>{0, 1, 1, 1});
    CHECK(t.leaders == std::vector<int>{0, 1});
    CHECK(t.local_size == 1);
    CHECK(t.local_ranks == std::vector<int>{0});
  }
  SECTION("one node") {
    const auto t = lc::topology_from_keys({"h", "h", "h"}, 2);
    CHECK(t.single_node());
    CHECK(t.leaders == std::vector<int>{0});
    CHECK(t.local_rank == 2);
    CHECK(t.local_size == 3);
  }
  SECTION("a rank outside the group") {
    CHECK_THAT(lt::error_of([] { lc::topology_from_keys({"a", "b"}, 2); }), Contains("rank 2"));
  }
}

TEST_CASE("discover_topology: every rank ends with the same topology", "[collectives][topology]") {
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  const std::vector<std::string> keys = {"host-b", "host-a", "host-b", "host-a", "host-c"};
  const auto all = discover_all(*store, keys, "g");
  for (int r = 0; r < 5; ++r) {
    INFO("rank " << r);
    const auto& t = all[static_cast<size_t>(r)];
    CHECK(t.node_of_rank == std::vector<int>{0, 1, 0, 1, 2});
    CHECK(t.nodes == 3);
    CHECK(t.leaders == std::vector<int>{0, 1, 4});
    CHECK(t.node == t.node_of_rank[static_cast<size_t>(r)]);
    CHECK(t.local_ranks[static_cast<size_t>(t.local_rank)] == r);
  }
}

TEST_CASE("discover_topology: a group made again under the same name reads fresh keys",
          "[collectives][topology]") {
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  CHECK(discover_all(*store, {"a", "a", "b"}, "again")[0].nodes == 2);
  // The same ranks now claim other nodes: the old keys must not be read.
  const auto second = discover_all(*store, {"a", "b", "c"}, "again");
  CHECK(second[0].nodes == 3);
  CHECK(second[2].node_of_rank == std::vector<int>{0, 1, 2});
  // Another name on the same store is independent.
  CHECK(discover_all(*store, {"x", "x", "x"}, "other")[1].single_node());
}

TEST_CASE("discover_topology: a rank that never publishes is named", "[collectives][topology]") {
  lockstep::distributed::MemoryStore store;
  std::string error;
  const auto errors = lt::run_ranks(2, [&](int r) {  // ranks 0 and 1 of 3; rank 2 never comes
    const std::string e =
        lt::error_of([&] { lc::discover_topology(store, r, 3, "late", "n", 300ms); });
    if (r == 0) error = e;
  });
  CHECK(errors[0] == nullptr);
  CHECK_THAT(error, Contains("rank 0 of group 'late'") && Contains("rank 2 did not publish"));
}

TEST_CASE("this_node_key: LOCKSTEP_NODE_ID, else host name and boot id",
          "[collectives][topology]") {
  const auto env = [](std::map<std::string, std::string> vars) {
    return [vars](const std::string& name) -> std::optional<std::string> {
      const auto it = vars.find(name);
      if (it == vars.end()) return std::nullopt;
      return it->second;
    };
  };
  const auto with_id = lockstep::distributed::read_rank_info(env({{"LOCKSTEP_NODE_ID", "nodeA"}}));
  CHECK(with_id.node_id == "nodeA");
  CHECK(lc::this_node_key(with_id) == "nodeA");

  const auto plain = lockstep::distributed::read_rank_info(env({}));
  CHECK(plain.node_id.empty());
  char host[HOST_NAME_MAX + 1] = {};
  REQUIRE(::gethostname(host, sizeof host - 1) == 0);
  const std::string key = lc::this_node_key(plain);
  CHECK_THAT(key, Catch::Matchers::StartsWith(std::string(host)));
  CHECK(key == lc::this_node_key(plain));  // stable: every process of this host agrees
  if (key.size() > std::string(host).size()) CHECK(key[std::string(host).size()] == ':');
}
