// Ranks started without lockstep-run (mpirun, srun, a daemon's own spawner)
// with stdin, stdout or stderr closed: init_process_group() must not let its
// store sockets take descriptor 0, 1 or 2, where the program's own prints
// (and lockstep's warnings) would be written into the store connection.
#include <catch2/catch.hpp>

#include <future>
#include <string>

#include <fmt/format.h>

#include "support/subprocess.h"

namespace {

using lockstep::testing::bin_path;
using lockstep::testing::describe;
using lockstep::testing::ProcessResult;
using lockstep::testing::run_process;
using lockstep::testing::unused_tcp_port;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

TEST_CASE("closed standard streams: ranks started with stdout closed keep their store connections",
          "[collectives][store][streams]") {
  // collective_worker prints to stdout once its group is made, then runs
  // every collective; its exit status says whether they all came out right.
  const std::string closed = GENERATE(">&-", "<&- >&-");
  const int port = unused_tcp_port();
  auto rank = [&](int r) {
    return std::async(std::launch::async, [=] {
      return run_process({"/bin/sh", "-c", "exec \"$0\" " + closed, bin_path("collective_worker")},
                         120s,
                         {fmt::format("PMI_RANK={}", r), "PMI_SIZE=2", "MASTER_ADDR=127.0.0.1",
                          fmt::format("MASTER_PORT={}", port), "LOCKSTEP_TIMEOUT_S=30"});
    });
  };
  auto r0 = rank(0);
  auto r1 = rank(1);
  const ProcessResult a = r0.get();
  const ProcessResult b = r1.get();
  INFO("closed: " << closed << "\nrank 0 " << describe(a) << ":\n" << a.output << "\nrank 1 "
                  << describe(b) << ":\n" << b.output);
  CHECK(a.ok());
  CHECK(b.ok());
  // Rank 1's "collective_worker rank 1 ..." lines, written into its store
  // connection, used to make rank 0's server drop it as a stranger.
  CHECK_THAT(a.output + b.output, !Contains("lockstep store server"));
}

}  // namespace
