// init_process_group()'s store from launcher variables alone, in real
// processes: rank 0 serves it at MASTER_ADDR/MASTER_PORT under any launcher
// (here MPICH's PMI variables, set by hand), and a rank whose store never
// comes says so while it waits, and a second process claiming a rank already
// taken fails at once; in one process, a second group beside the first
// shares rank 0's server. torchrun and Slurm themselves are tested in
// tests/launcher/.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <future>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "collectives/rank_threads.h"
#include "lockstep/distributed/store/memory_store.h"
#include "lockstep/distributed/store/tcp_store.h"
#include "support/subprocess.h"

namespace lc = lockstep::collectives;
namespace lt = lockstep::testing;
using lockstep::runtime::Tensor;
using lockstep::testing::bin_path;
using lockstep::testing::describe;
using lockstep::testing::ProcessResult;
using lockstep::testing::run_process;
using lockstep::testing::unused_tcp_port;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

TEST_CASE("store rendezvous: with MASTER_ADDR/MASTER_PORT rank 0 serves the store",
          "[collectives][store]") {
  const int port = unused_tcp_port();
  auto rank = [&](int r) {
    return std::async(std::launch::async, [=] {
      return run_process({bin_path("collective_worker")}, 120s,
                         {fmt::format("PMI_RANK={}", r), "PMI_SIZE=2", "MASTER_ADDR=127.0.0.1",
                          fmt::format("MASTER_PORT={}", port), "LOCKSTEP_TIMEOUT_S=60"});
    });
  };
  auto r0 = rank(0);
  auto r1 = rank(1);
  const ProcessResult a = r0.get();
  const ProcessResult b = r1.get();
  INFO("rank 0 " << describe(a) << ":\n" << a.output << "\nrank 1 " << describe(b) << ":\n"
                 << b.output);
  CHECK(a.ok());
  CHECK(b.ok());
  CHECK_THAT(a.output, Contains("collective_worker rank 0/2: OK"));
  CHECK_THAT(b.output, Contains("collective_worker rank 1/2: OK"));
}

TEST_CASE("store rendezvous: a rank whose store never comes says so while it waits",
          "[collectives][store]") {
  // Nobody serves: rank 0 is never started.
  const int port = unused_tcp_port();
  const auto r = run_process({bin_path("collective_worker")}, 60s,
                             {"PMI_RANK=1", "PMI_SIZE=2", "MASTER_ADDR=127.0.0.1",
                              fmt::format("MASTER_PORT={}", port), "LOCKSTEP_TIMEOUT_S=3",
                              "LOCKSTEP_STALL_REPORT_S=0.5"});
  INFO(describe(r) << "\n" << r.output);
  CHECK_FALSE(r.timed_out);
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.output,
             Contains(fmt::format("rank 1 of 2 (from pmi; store address from "
                                  "MASTER_ADDR/MASTER_PORT) has been connecting to the store at "
                                  "127.0.0.1:{}",
                                  port)));
  CHECK_THAT(r.output, Contains("could not connect"));
}

TEST_CASE("store rendezvous: a second process claiming a rank already taken fails at once, "
          "naming the first",
          "[collectives][store]") {
  // Two jobs given one store address and token (two Slurm clusters whose job
  // and step ids coincide, a reused MASTER_PORT) used to mix their ranks'
  // keys and wait on each other without end. Here rank 1 is started twice
  // around a store served by the test, so every process reaches it.
  const std::string token = fmt::format("duplicate-rank-{}", ::getpid());
  lockstep::distributed::TcpStoreServer server({.host = "127.0.0.1", .port = 0, .token = token});
  const std::string address = fmt::format("127.0.0.1:{}", server.port());
  const int ranks[] = {0, 1, 1};
  std::vector<ProcessResult> results(3);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      const int r = ranks[i];
      results[i] = run_process(
          {bin_path("collective_worker")}, 60s,
          {fmt::format("LOCKSTEP_RANK={}", r), "LOCKSTEP_WORLD_SIZE=2",
           fmt::format("LOCKSTEP_LOCAL_RANK={}", r), "LOCKSTEP_LOCAL_WORLD_SIZE=2",
           "LOCKSTEP_STORE_ADDR=" + address, "LOCKSTEP_TOKEN=" + token, "LOCKSTEP_TIMEOUT_S=30"});
    });
  }
  for (auto& t : threads) t.join();
  std::string all;
  for (size_t i = 0; i < 3; ++i) {
    all += fmt::format("--- process {} (rank {}): {} after {:.1f} s\n{}", i, ranks[i],
                       describe(results[i]), results[i].seconds, results[i].output);
  }
  INFO(all);
  CHECK(results[0].ok());
  // Whichever rank 1 claimed first trains with rank 0; the other is refused
  // before it touches a key, long before the group's timeout.
  REQUIRE(results[1].ok() != results[2].ok());
  const ProcessResult& winner = results[1].ok() ? results[1] : results[2];
  const ProcessResult& loser = results[1].ok() ? results[2] : results[1];
  CHECK_THAT(winner.output, Contains("collective_worker rank 1/2: OK"));
  std::smatch m;
  REQUIRE(std::regex_search(winner.output, m, std::regex(R"(collective_worker rank 1 pid (\d+))")));
  CHECK(loser.exit_code == 1);
  CHECK(loser.seconds < 20.0);
  CHECK_THAT(loser.output, Contains("rank 1 of group 'default' is already taken on this store by"));
  CHECK_THAT(loser.output, Contains(fmt::format(" pid {} (tag ", m[1].str())));
  CHECK_THAT(loser.output, Contains("two jobs were given the same store address"));
}

TEST_CASE("store rendezvous: where rank 0 serves the store, a second group beside the first "
          "shares its server",
          "[collectives][store]") {
  // PyTorch's new_group beside the default group: under torchrun's
  // variables each init_process_group() of rank 0 used to listen on
  // MASTER_PORT again, which its first group's server still held.
  const int port = unused_tcp_port();
  std::vector<std::string> results(2);
  const auto errors = lt::run_ranks(2, [&](int r) {
    lockstep::distributed::RankInfo info;
    info.rank = info.local_rank = r;
    info.world_size = info.local_world_size = 2;
    info.store_host = "127.0.0.1";
    info.store_port = port;
    info.token = fmt::format("second-group-{}", ::getpid());
    info.rank0_serves_store = true;
    info.source = "torchrun";
    info.store_address_from = "MASTER_ADDR/MASTER_PORT";
    const lc::InitOptions options{.backend = "shm", .timeout = 20s, .rank_info = info};
    auto first = lc::init_process_group(options);
    auto second_options = options;
    second_options.name = "second";
    auto second = lc::init_process_group(second_options);
    for (auto* group : {second.get(), first.get()}) {
      Tensor t = Tensor::ones({3});
      group->allreduce(t)->wait();
      results[static_cast<size_t>(r)] += fmt::format("{} ", t.data_ptr<float>()[0]);
    }
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << lt::message_of(errors[static_cast<size_t>(r)]));
    CHECK(errors[static_cast<size_t>(r)] == nullptr);
    CHECK(results[static_cast<size_t>(r)] == "2 2 ");
  }
}

TEST_CASE("store rendezvous: ranks that disagree on the world size fail at once, naming the "
          "sizes",
          "[collectives][store]") {
  // WORLD_SIZE set differently on one rank: each used to wait out the
  // timeout for ranks the other does not have, rank 0's error naming a key.
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  const auto start = std::chrono::steady_clock::now();
  const auto errors = lt::run_ranks(2, [&](int r) {
    lockstep::distributed::RankInfo info;
    info.rank = info.local_rank = r;
    info.world_size = info.local_world_size = r == 0 ? 2 : 3;
    lc::init_process_group({.backend = "shm", .timeout = 10s, .rank_info = info, .store = store});
  });
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK_THAT(lt::message_of(errors[static_cast<size_t>(r)]),
               Contains("the ranks of group 'default' disagree on its size: rank 0 has 2 ranks, "
                        "rank 1 has 3"));
  }
}
