// Started by lockstep-run or mpirun (tests/collectives/
// test_multiprocess_sync_bn.cpp): init_process_group() from the environment,
// then SyncBatchNorm against BatchNorm on the global batch for [N, C],
// [N, C, L] and [N, C, H, W] inputs, local batches of uneven size and, from 3
// ranks on, one empty rank (checks and tolerance: tests/nn/sync_bn_check.h).
//
// Prints "sync_bn_worker rank R/N: OK (<cases> cases)" and exits 0, or prints
// every mismatch and exits 1. An exception exits at once (without waiting for
// the others), so the launcher or mpirun ends the job instead of a hang.
//
// Flags: --backend NAME   instead of LOCKSTEP_BACKEND / the default
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lockstep/collectives/init.h"
#include "nn/sync_bn_check.h"

namespace lc = lockstep::collectives;
namespace lt = lockstep::testing;
using lockstep::runtime::DType;

namespace {

std::string parse_backend(int argc, char** argv) {
  std::string backend;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--backend" && i + 1 < argc) {
      backend = argv[++i];
    } else {
      throw lockstep::Error(fmt::format("sync_bn_worker: unknown flag {} (expected --backend "
                                        "NAME)",
                                        arg));
    }
  }
  return backend;
}

// Uneven local batch sizes: rank r gets r + 2 rows, except rank 1 of 3 or
// more, which gets none.
std::vector<int64_t> batch_sizes(int world) {
  std::vector<int64_t> sizes;
  for (int r = 0; r < world; ++r) sizes.push_back(r == 1 && world >= 3 ? 0 : r + 2);
  return sizes;
}

std::vector<lt::SyncBnCase> cases(int world) {
  const auto sizes = batch_sizes(world);
  return {
      {.name = "[N, C]", .batch_sizes = sizes, .channels = 5, .tail = {}},
      {.name = "[N, C, L]", .batch_sizes = sizes, .channels = 3, .tail = {7}},
      {.name = "[N, C, H, W]", .batch_sizes = sizes, .channels = 3, .tail = {4, 5}},
      {.name = "[N, C, H, W] f64", .batch_sizes = sizes, .channels = 2, .tail = {3, 3},
       .dtype = DType::f64},
      {.name = "momentum=None", .batch_sizes = sizes, .channels = 2, .tail = {6},
       .options = {.momentum = std::nullopt}, .steps = 3},
  };
}

}  // namespace

int main(int argc, char** argv) {
  std::string who = "sync_bn_worker";
  try {
    lc::InitOptions options;
    options.backend = parse_backend(argc, argv);
    auto group = lc::init_process_group(options);
    who = fmt::format("sync_bn_worker rank {}/{}", group->rank(), group->size());
    std::vector<std::string> errors;
    const auto all = cases(group->size());
    for (const auto& c : all) {
      const auto found = lt::check_sync_bn_rank(group, c);
      errors.insert(errors.end(), found.begin(), found.end());
    }
    group->barrier({.timeout = {}})->wait();
    if (!errors.empty()) {
      for (const auto& e : errors)
        std::fprintf(stderr, "%s: MISMATCH: %s\n", who.c_str(), e.c_str());
      std::fprintf(stderr, "%s: FAILED (%zu mismatches)\n", who.c_str(), errors.size());
      return 1;
    }
    std::printf("%s: OK (%zu cases)\n", who.c_str(), all.size());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: FAILED: %s\n", who.c_str(), e.what());
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(1);
  }
}
