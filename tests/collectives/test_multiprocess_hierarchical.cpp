// The default backend across real processes, with no LOCKSTEP_BACKEND: two
// lockstep-run launchers on this machine act as two nodes (LOCKSTEP_NODE_ID
// tells them apart) and must get shm+gloo; one launcher alone must get shm.
// collective_worker (tests/workers/) checks every collective itself and
// prints the backend init_process_group chose.
#include <catch2/catch.hpp>

#include "lockstep/config.h"

#if LOCKSTEP_HAVE_GLOO


#include <future>
#include <string>

#include <fmt/format.h>

#include "support/subprocess.h"

namespace lt = lockstep::testing;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

namespace {


void check_ranks(const std::string& output, int np, const std::string& backend) {
  for (int r = 0; r < np; ++r) {
    CHECK_THAT(output, Contains(fmt::format("collective_worker rank {}/{}: backend {}\n", r, np,
                                            backend)));
    CHECK_THAT(output, Contains(fmt::format("collective_worker rank {}/{}: OK (", r, np)));
  }
}

}  // namespace

TEST_CASE("default backend across two nodes (two launchers): shm+gloo",
          "[collectives][hierarchical][shm]") {
  const std::string port = std::to_string(lt::unused_tcp_port());
  const auto node = [&](int node_rank, const std::string& node_id) {
    return lt::run_process(
        {lt::bin_path("lockstep-run"), "--nnodes", "2", "--node-rank",
         std::to_string(node_rank), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
         "--master-port", port, "--tag-output", lt::bin_path("collective_worker")},
        180s,
        {"LOCKSTEP_TOKEN=two-node-test", "LOCKSTEP_NODE_ID=" + node_id,
         "LOCKSTEP_TIMEOUT_S=60"});
  };
  auto node0 = std::async(std::launch::async, node, 0, "nodeA");
  auto node1 = std::async(std::launch::async, node, 1, "nodeB");
  const auto r0 = node0.get();
  const auto r1 = node1.get();
  const std::string output = r0.output + r1.output;
  INFO("node 0: " << lt::describe(r0) << "\n" << r0.output);
  INFO("node 1: " << lt::describe(r1) << "\n" << r1.output);
  CHECK(r0.ok());
  CHECK(r1.ok());
  check_ranks(output, 4, "shm+gloo");
}

TEST_CASE("default backend on one node (one launcher): shm", "[collectives][hierarchical][shm]") {
  const auto result = lt::run_process(
      {lt::bin_path("lockstep-run"), "-np", "2", "--tag-output", lt::bin_path("collective_worker")},
      120s, {"LOCKSTEP_TIMEOUT_S=60"});
  INFO(lt::describe(result) << "\n" << result.output);
  CHECK(result.ok());
  check_ranks(result.output, 2, "shm");
}

#endif  // LOCKSTEP_HAVE_GLOO
