// init_process_group, drop the group, init_process_group again, in the same
// processes: a sweep or a notebook running several trainings one after
// another, as PyTorch's destroy_process_group() then init_process_group()
// allows.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "collectives/rank_threads.h"
#include "lockstep/collectives/init.h"
#include "lockstep/distributed/store/memory_store.h"
#include "lockstep/distributed/store/tcp_store.h"
#include "support/backend_skip.h"
#include "support/subprocess.h"

namespace lc = lockstep::collectives;
namespace lt = lockstep::testing;
using lockstep::runtime::Tensor;
using namespace std::chrono_literals;

namespace {

lockstep::distributed::RankInfo torchrun_info(int rank, int size, int port) {
  lockstep::distributed::RankInfo info;
  info.rank = info.local_rank = rank;
  info.world_size = info.local_world_size = size;
  info.store_host = "127.0.0.1";
  info.store_port = port;
  info.token = fmt::format("reinit-{}", ::getpid());
  info.rank0_serves_store = true;
  info.source = "torchrun";
  info.store_address_from = "MASTER_ADDR/MASTER_PORT";
  return info;
}

}  // namespace

TEST_CASE("reinit: where rank 0 serves the store, a rank that makes its next group while "
          "rank 0 still holds the last one meets rank 0's next group",
          "[collectives][store][reinit]") {
  const std::string backend = GENERATE(as<std::string>{}, "shm", "gloo");
  if (backend == "gloo") LOCKSTEP_SKIP_UNLESS_BACKEND("gloo");
  const int port = lt::unused_tcp_port();
  constexpr int kRounds = 3;
  std::vector<std::string> results(2);
  const auto errors = lt::run_ranks(2, [&](int r) {
    const lc::InitOptions options{.backend = backend, .timeout = 20s,
                                  .rank_info = torchrun_info(r, 2, port)};
    for (int round = 1; round <= kRounds; ++round) {
      auto group = lc::init_process_group(options);
      Tensor t = Tensor::full({3}, static_cast<float>(round));
      group->allreduce(t)->wait();
      results[static_cast<size_t>(r)] += fmt::format("{} ", t.data_ptr<float>()[0]);
      if (r == 0) {
        // Rank 0 saves a checkpoint, say, while rank 1 goes on: it drops its
        // group only once rank 1 has published its part of the next one.
        if (round == kRounds) continue;
        lockstep::distributed::TcpStore store(
            {.host = "127.0.0.1", .port = static_cast<uint16_t>(port),
             .token = options.rank_info->token, .timeout = 30s});
        store.wait({fmt::format("default/placement/{}/1", round + 1)}, 30s);
      }
    }
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << lt::message_of(errors[static_cast<size_t>(r)]));
    CHECK(errors[static_cast<size_t>(r)] == nullptr);
    CHECK(results[static_cast<size_t>(r)] == "2 4 6 ");
  }
}

TEST_CASE("reinit: processes where rank 0 serves the store make their groups again with one "
          "rank slower, and end with the last group held in a static",
          "[collectives][store][reinit]") {
  const std::string backend = GENERATE(as<std::string>{}, "shm", "gloo");
  if (backend == "gloo") LOCKSTEP_SKIP_UNLESS_BACKEND("gloo");
  const int port = lt::unused_tcp_port();
  constexpr int kRanks = 3;
  std::vector<lt::ProcessResult> results(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      results[static_cast<size_t>(r)] = lt::run_process(
          {lt::bin_path("reinit_worker"), "--backend", backend, "--rounds", "3", "--slow-rank",
           "0", "--end", "return"},
          120s,
          {fmt::format("PMI_RANK={}", r), fmt::format("PMI_SIZE={}", kRanks),
           "MASTER_ADDR=127.0.0.1", fmt::format("MASTER_PORT={}", port),
           "LOCKSTEP_TIMEOUT_S=30"});
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    const lt::ProcessResult& result = results[static_cast<size_t>(r)];
    INFO("rank " << r << " " << lt::describe(result) << ":\n" << result.output);
    CHECK(result.ok());
    CHECK_THAT(result.output,
               Catch::Matchers::Contains(fmt::format("reinit_worker rank {}/3: round 3 OK", r)));
    CHECK_THAT(result.output,
               Catch::Matchers::Contains(fmt::format("reinit_worker rank {}/3: done", r)));
  }
}

TEST_CASE("reinit: a child forked while rank 0 serves the store ends with exit(), and the "
          "parent makes its group again",
          "[collectives][store][reinit]") {
  // The server outlives the groups, so a child forked between them has it
  // among its statics; it leaves it, with its threads, to the parent.
  const std::string backend = GENERATE(as<std::string>{}, "shm", "gloo");
  if (backend == "gloo") LOCKSTEP_SKIP_UNLESS_BACKEND("gloo");
  const auto result = lt::run_process(
      {lt::bin_path("reinit_worker"), "--backend", backend, "--rounds", "2", "--fork-child", "1"},
      120s,
      {"RANK=0", "WORLD_SIZE=1", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1",
       fmt::format("MASTER_PORT={}", lt::unused_tcp_port()), "LOCKSTEP_TIMEOUT_S=30"});
  INFO(lt::describe(result) << ":\n" << result.output);
  CHECK(result.ok());
  CHECK_THAT(result.output, Catch::Matchers::Contains("reinit_worker rank 0/1: round 2 OK"));
  CHECK_THAT(result.output, Catch::Matchers::Contains("reinit_worker: done"));
}

TEST_CASE("reinit: a rank late to an init another rank gave up on meets that rank's next try",
          "[collectives][store][reinit]") {
  // A retry loop around init_process_group with a short timeout: rank 0's
  // first try times out before rank 1 comes. Rank 1 used to take rank 0's
  // value from that try as a meeting and go on into the backend alone; every
  // later try of either was then one making apart from the other's.
  const std::string backend = GENERATE(as<std::string>{}, "shm", "gloo");
  if (backend == "gloo") LOCKSTEP_SKIP_UNLESS_BACKEND("gloo");
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  std::atomic<bool> gave_up{false};
  std::vector<std::string> results(2);
  const auto errors = lt::run_ranks(2, [&](int r) {
    lc::InitOptions options{.backend = backend, .timeout = 20s,
                            .rank_info = torchrun_info(r, 2, 1), .store = store};
    if (r == 0) {
      auto first = options;
      first.timeout = 200ms;
      CHECK_THROWS_WITH(lc::init_process_group(first),
                        Catch::Matchers::Contains("but rank 1 did not publish one"));
      gave_up = true;
      gave_up.notify_all();
    } else {
      gave_up.wait(false);
    }
    auto group = lc::init_process_group(options);
    Tensor t = Tensor::full({3}, static_cast<float>(r + 1));
    group->allreduce(t)->wait();
    results[static_cast<size_t>(r)] = fmt::format("{}", t.data_ptr<float>()[0]);
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << lt::message_of(errors[static_cast<size_t>(r)]));
    CHECK(errors[static_cast<size_t>(r)] == nullptr);
    CHECK(results[static_cast<size_t>(r)] == "3");
  }
}
