// The shm backend across real processes. lockstep-run starts collective_worker
// (tests/workers/), which checks every collective itself; and a rank that is
// SIGKILLed while the others wait in a collective must not hang them: they
// notice the dead peer long before the group's timeout and fail naming it.
// lockstep-run would end the job itself when a rank dies, hiding the backend's
// own detection, so those tests start the ranks directly around a store served
// here. Either way no /dev/shm file of the job may be left behind.
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "lockstep/collectives/shm/shm_segment.h"
#include "lockstep/distributed/store/tcp_store.h"
#include "support/subprocess.h"

namespace lc = lockstep::collectives;
namespace lt = lockstep::testing;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

namespace {

lt::ProcessResult launch(int np, std::chrono::milliseconds limit) {
  const std::vector<std::string> argv = {lt::bin_path("lockstep-run"), "-np", std::to_string(np),
                                         "--tag-output", lt::bin_path("collective_worker")};
  return lt::run_process(argv, limit, {"LOCKSTEP_BACKEND=shm", "LOCKSTEP_TIMEOUT_S=60"});
}

// The pid collective_worker's rank 0 printed, or -1.
long rank0_pid(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex(R"(collective_worker rank 0 pid (\d+))"))) return -1;
  return std::stol(m[1].str());
}

// The /dev/shm files left by the job whose rank 0 had `pid` (its segments are
// named "<segment_prefix()><pid>-<serial>").
std::vector<std::string> files_left_by(long pid) {
  const std::string prefix = lc::shm::segment_prefix() + std::to_string(pid) + "-";
  std::vector<std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) found.push_back(name);
  }
  return found;
}

void check_all_ok(int np) {
  const auto result = launch(np, 180s);
  INFO(lt::describe(result) << "\n" << result.output);
  CHECK(result.ok());
  CHECK_THAT(result.output, !Contains("FAILED"));
  for (int r = 0; r < np; ++r) {
    CHECK_THAT(result.output, Contains(fmt::format("collective_worker rank {}/{}: backend shm", r, np)));
    CHECK_THAT(result.output, Contains(fmt::format("collective_worker rank {}/{}: OK (", r, np)));
  }
  const long pid = rank0_pid(result.output);
  REQUIRE(pid > 0);
  CHECK(files_left_by(pid).empty());
}

// Starts `np` collective_worker processes as ranks of one shm job around a
// store served here, rank `killed` SIGKILLing itself after the first barrier;
// returns each rank's result.
std::vector<lt::ProcessResult> run_with_killed_rank(int np, int killed) {
  const std::string token = fmt::format("shm-dead-peer-{}", ::getpid());
  lockstep::distributed::TcpStoreServer server({.host = "127.0.0.1", .port = 0, .token = token});
  const std::string address = fmt::format("127.0.0.1:{}", server.port());
  std::vector<lt::ProcessResult> results(static_cast<size_t>(np));
  std::vector<std::thread> threads;
  for (int r = 0; r < np; ++r) {
    threads.emplace_back([&, r] {
      // Past the limit the rank is SIGKILLed and reported as timed out: well
      // below the group's 60 s timeout, so only dead-peer detection passes.
      results[static_cast<size_t>(r)] = lt::run_process(
          {lt::bin_path("collective_worker"), "--kill-at-rank", std::to_string(killed)}, 45s,
          {fmt::format("LOCKSTEP_RANK={}", r), fmt::format("LOCKSTEP_WORLD_SIZE={}", np),
           fmt::format("LOCKSTEP_LOCAL_RANK={}", r), fmt::format("LOCKSTEP_LOCAL_WORLD_SIZE={}", np),
           "LOCKSTEP_STORE_ADDR=" + address, "LOCKSTEP_TOKEN=" + token, "LOCKSTEP_BACKEND=shm",
           "LOCKSTEP_TIMEOUT_S=60"});
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

void check_dead_peer(int np, int killed) {
  const auto results = run_with_killed_rank(np, killed);
  std::string all;
  for (int r = 0; r < np; ++r) {
    const auto& result = results[static_cast<size_t>(r)];
    all += fmt::format("--- rank {}: {} after {:.1f} s\n{}", r, lt::describe(result),
                       result.seconds, result.output);
  }
  INFO(all);
  for (int r = 0; r < np; ++r) {
    const auto& result = results[static_cast<size_t>(r)];
    INFO("rank " << r);
    CHECK_FALSE(result.timed_out);
    if (r == killed) {
      CHECK(result.signal == SIGKILL);
      CHECK_THAT(result.output, Contains("killing itself with SIGKILL"));
      continue;
    }
    // A survivor fails on its own, long before the 60 s timeout, naming the
    // dead rank in its error.
    CHECK(result.exit_code == 1);
    CHECK(result.seconds < 20.0);
    const auto failed = result.output.find("FAILED:");
    REQUIRE(failed != std::string::npos);
    const std::string error = result.output.substr(failed);
    CHECK_THAT(error, Contains(fmt::format("rank {}", killed)));
    CHECK_THAT(error, !Contains("timed out"));
    CHECK_THAT(result.output, !Contains(": OK ("));
  }
  // Rank 0 printed its pid before the first barrier, so before any kill.
  long pid = -1;
  for (const auto& result : results) {
    if (pid < 0) pid = rank0_pid(result.output);
  }
  REQUIRE(pid > 0);
  CHECK(files_left_by(pid).empty());
}

}  // namespace

TEST_CASE("shm across processes: every collective and dtype, 2 ranks", "[collectives][shm]") {
  check_all_ok(2);
}

TEST_CASE("shm across processes: every collective and dtype, 3 ranks", "[collectives][shm]") {
  check_all_ok(3);
}

TEST_CASE("shm across processes: every collective and dtype, 4 ranks", "[collectives][shm]") {
  check_all_ok(4);
}

TEST_CASE("shm across processes: rank 1 of 2 killed mid-job fails the other naming it",
          "[collectives][shm]") {
  check_dead_peer(2, 1);
}

TEST_CASE("shm across processes: rank 2 of 3 killed mid-job fails the others naming it",
          "[collectives][shm]") {
  check_dead_peer(3, 2);
}

TEST_CASE("shm across processes: rank 0 of 4 killed mid-job fails the others naming it",
          "[collectives][shm]") {
  check_dead_peer(4, 0);
}
