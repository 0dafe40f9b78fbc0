// collectives::spawn on a GPU, through tests/workers/spawn_worker.cpp: a
// program of its own, because a forked child cannot use CUDA once its parent
// has (this test process probes the GPUs to decide whether to skip).
#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include <fmt/format.h>

#include "support/gpu_skip.h"
#include "support/subprocess.h"

namespace lt = lockstep::testing;
using namespace std::chrono_literals;

TEST_CASE("spawn on CUDA: two ranks started from one program all-reduce CUDA tensors",
          "[gpu][spawn][multiprocess]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  const auto result = lt::run_process(
      {lt::bin_path("spawn_worker"), "--nprocs", "2", "--device", "cuda"}, 300s);
  INFO(lt::describe(result) << "\n" << result.output);
  REQUIRE(result.ok());
  for (int r = 0; r < 2; ++r)
    CHECK(result.output.find(fmt::format("spawn_worker rank {}/2 on cuda:", r)) !=
          std::string::npos);
}
