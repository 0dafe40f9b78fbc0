// The gloo backend across real processes: lockstep-run starts
// collective_worker (tests/workers/), which checks every collective itself.
#include <catch2/catch.hpp>

#include "lockstep/config.h"

#if LOCKSTEP_HAVE_GLOO


#include <string>

#include <fmt/format.h>

#include "support/subprocess.h"

namespace lt = lockstep::testing;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

namespace {

lt::ProcessResult launch(int np, const std::vector<std::string>& worker_flags,
                         std::chrono::milliseconds limit,
                         const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv = {lt::bin_path("lockstep-run"), "-np", std::to_string(np),
                                   "--tag-output", lt::bin_path("collective_worker")};
  argv.insert(argv.end(), worker_flags.begin(), worker_flags.end());
  std::vector<std::string> full_env = {"LOCKSTEP_BACKEND=gloo", "LOCKSTEP_TIMEOUT_S=60"};
  full_env.insert(full_env.end(), env.begin(), env.end());
  return lt::run_process(argv, limit, full_env);
}

void check_all_ok(const lt::ProcessResult& result, int np) {
  INFO(lt::describe(result) << "\n" << result.output);
  CHECK(result.ok());
  for (int r = 0; r < np; ++r) {
    CHECK_THAT(result.output, Contains(fmt::format("collective_worker rank {}/{}: OK (", r, np)));
  }
}


}  // namespace

TEST_CASE("gloo across processes: every collective and dtype, 2 ranks", "[collectives][gloo]") {
  check_all_ok(launch(2, {}, 120s), 2);
}

TEST_CASE("gloo across processes: every collective and dtype, 4 ranks", "[collectives][gloo]") {
  check_all_ok(launch(4, {}, 120s), 4);
}

TEST_CASE("gloo across processes: a rank that exits early or is killed ends the job",
          "[collectives][gloo]") {
  const bool kill = GENERATE(false, true);
  const auto result = launch(3, {kill ? "--kill-at-rank" : "--die-at-rank", "1"}, 10s);
  INFO(lt::describe(result) << "\n" << result.output);
  CHECK_FALSE(result.timed_out);
  CHECK(result.exit_code != 0);
  CHECK_THAT(result.output, Contains("rank 1"));
  CHECK_THAT(result.output, Contains(kill ? "SIGKILL" : "code 3"));
  CHECK_THAT(result.output, !Contains("collective_worker rank 1/3: OK"));
}

TEST_CASE("gloo across processes: LOCKSTEP_DEBUG=detail names a divergent call",
          "[collectives][gloo]") {
  const auto result = launch(3, {"--diverge-at-rank", "1"}, 60s, {"LOCKSTEP_DEBUG=detail"});
  INFO(lt::describe(result) << "\n" << result.output);
  CHECK_FALSE(result.timed_out);
  CHECK(result.exit_code != 0);
  CHECK_THAT(result.output, Contains("collective #2 differs across ranks of group 'default'") &&
                                Contains("ranks 0 and 2 called allreduce(f32, 1000 elements, sum)") &&
                                Contains("rank 1 called broadcast(f32, 1000 elements, root 0)"));
}

TEST_CASE("gloo across processes: an unserved store address fails naming it",
          "[collectives][gloo]") {
  const int port = lt::unused_tcp_port();
  const std::string address = fmt::format("127.0.0.1:{}", port);
  const auto result = lt::run_process(
      {lt::bin_path("collective_worker")}, 30s,
      {"LOCKSTEP_RANK=1", "LOCKSTEP_WORLD_SIZE=2", "LOCKSTEP_LOCAL_RANK=1",
       "LOCKSTEP_LOCAL_WORLD_SIZE=2", "LOCKSTEP_STORE_ADDR=" + address, "LOCKSTEP_TOKEN=t",
       "LOCKSTEP_BACKEND=gloo", "LOCKSTEP_TIMEOUT_S=3"});
  INFO(lt::describe(result) << "\n" << result.output);
  CHECK_FALSE(result.timed_out);
  CHECK(result.exit_code == 1);
  CHECK_THAT(result.output, Contains("FAILED") && Contains(address));
}

#endif  // LOCKSTEP_HAVE_GLOO
