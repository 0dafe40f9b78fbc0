// init_process_group()'s store from launcher variables alone, in real
// processes: rank 0 serves it at MASTER_ADDR/MASTER_PORT under any launcher
// (here MPICH's PMI variables, set by hand), and a rank whose store never
// comes says so while it waits. torchrun and Slurm themselves are tested in
// tests/launcher/.
#include <catch2/catch.hpp>

#include <future>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "support/subprocess.h"

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
