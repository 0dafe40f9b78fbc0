// DDP on CUDA tensors in real processes (tests/workers/cuda_ddp_worker.cpp):
// two processes sharing one GPU over gloo (CUDA tensors staged through host
// memory) and one process over NCCL, each equal to the same DDP on the CPU.
#include <catch2/catch.hpp>

#include <chrono>
#include <iostream>
#include <string>

#include <fmt/format.h>

#include "lockstep/collectives/backends.h"
#include "lockstep/config.h"
#include "support/gpu_skip.h"
#include "support/subprocess.h"

namespace lt = lockstep::testing;
using namespace std::chrono_literals;

namespace {

void run_and_check(int ranks, const std::string& backend) {
  if (!lockstep::collectives::is_built_in(backend)) {  // scripts/gpu-check may build without gloo
    std::cout << "SKIPPED: lockstep built without " << backend << "\n";
    return;
  }
  const auto result = lt::run_process({lt::bin_path("lockstep-run"), "-np", std::to_string(ranks),
                                       lt::bin_path("cuda_ddp_worker"), "--backend", backend},
                                      300s);
  INFO(lt::describe(result) << "\n" << result.output);
  REQUIRE(result.ok());
  for (int r = 0; r < ranks; ++r)
    CHECK(result.output.find(fmt::format("cuda_ddp_worker rank {}/{}: OK", r, ranks)) !=
          std::string::npos);
}

}  // namespace

TEST_CASE("DDP on CUDA, two processes on one GPU over gloo, equals DDP on the CPU",
          "[gpu][cuda_ddp][multiprocess]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  run_and_check(2, "gloo");
}

TEST_CASE("DDP on CUDA over NCCL at world size 1 equals DDP on the CPU",
          "[gpu][cuda_ddp][multiprocess]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
#if !LOCKSTEP_HAVE_NCCL
  std::cout << "SKIPPED: lockstep built without NCCL\n";
  return;
#endif
  run_and_check(1, "nccl");
}
