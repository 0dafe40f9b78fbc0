// Started by tests/collectives/test_reinit.cpp: init_process_group() from the
// environment, an all-reduce checked exactly, then, as the flags say, the
// group dropped and made again, or kept until the process ends.
//
// Prints "reinit_worker rank R/N: round K OK" after each round's all-reduce
// and "reinit_worker rank R/N: done" before it ends; exits 1 on an error.
//
// Flags: --backend NAME   instead of LOCKSTEP_BACKEND / the default
//        --rounds K       K rounds of init, all-reduce, drop (default 1)
//        --slow-rank R    rank R waits 300 ms before dropping each group
//        --fork-child 1   after each round, forks a child that ends with
//                         std::exit(0); fails unless it ends at once
//        --subgroup 1     each round also all-reduces over new_group(ranks
//                         n-1 .. 1)
//        --end HOW        after the last round, with a group live: "return"
//                         (from main, the group held in a static), "exit"
//                         (std::exit(0)) or "quick-exit" (std::quick_exit(0))
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "lockstep/collectives/init.h"
#include "lockstep/collectives/new_group.h"
#include "lockstep/runtime/tensor.h"

namespace lc = lockstep::collectives;
using lockstep::runtime::Tensor;

namespace {

std::shared_ptr<lc::ProcessGroup> kept;  // destroyed after main returns

// Forks a child that ends with std::exit(0), running the destructors of the
// statics it inherited; true when it ended so within 20 s.
bool end_child() {
  const pid_t child = ::fork();
  if (child == 0) std::exit(0);
  int status = -1;
  for (int i = 0; i < 2000; ++i) {
    if (::waitpid(child, &status, WNOHANG) == child) {
      std::printf("reinit_worker: child ended (status %d)\n", status);
      return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, &status, 0);
  std::printf("reinit_worker: child did not end\n");
  return false;
}

int run(int argc, char** argv) {
  std::string backend, end;
  int rounds = 1, slow_rank = -1;
  bool subgroup = false, fork_child = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--backend") backend = argv[i + 1];
    else if (arg == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (arg == "--slow-rank") slow_rank = std::atoi(argv[i + 1]);
    else if (arg == "--end") end = argv[i + 1];
    else if (arg == "--fork-child") fork_child = std::atoi(argv[i + 1]) != 0;
    else if (arg == "--subgroup") subgroup = std::atoi(argv[i + 1]) != 0;
  }
  for (int round = 1; round <= rounds; ++round) {
    auto group = lc::init_process_group({.backend = backend});
    Tensor t = Tensor::full({5}, static_cast<float>(group->rank() + round));
    group->allreduce(t)->wait();
    const int n = group->size();
    const float want = static_cast<float>(n * (n - 1) / 2 + n * round);
    if (t.data_ptr<float>()[4] != want) {
      std::printf("reinit_worker rank %d/%d: round %d got %g, want %g\n", group->rank(), n, round,
                  static_cast<double>(t.data_ptr<float>()[4]), static_cast<double>(want));
      return 1;
    }
    if (subgroup) {
      std::vector<int> ranks;
      for (int r = n - 1; r >= 1; --r) ranks.push_back(r);
      auto sub = lc::new_group(*group, ranks);
      if (sub) {
        Tensor s = Tensor::full({3}, static_cast<float>(round));
        sub->allreduce(s)->wait();
        if (s.data_ptr<float>()[0] != static_cast<float>(round * (n - 1))) {
          std::printf("reinit_worker rank %d/%d: round %d subgroup got %g\n", group->rank(), n,
                      round, static_cast<double>(s.data_ptr<float>()[0]));
          return 1;
        }
      }
    }
    const int rank = group->rank();
    std::printf("reinit_worker rank %d/%d: round %d OK\n", rank, n, round);
    std::fflush(stdout);
    if (rank == slow_rank) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (round < rounds || end.empty()) group.reset();
    if (fork_child && !end_child()) return 1;
    if (round == rounds && !end.empty()) {
      std::printf("reinit_worker rank %d/%d: done\n", rank, n);
      std::fflush(stdout);
      kept = group;
      if (end == "exit") std::exit(0);
      if (end == "quick-exit") std::quick_exit(0);
    }
  }
  if (end.empty()) std::printf("reinit_worker: done\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::printf("reinit_worker: %s\n", e.what());
    return 1;
  }
}
