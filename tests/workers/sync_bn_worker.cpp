// Started by lockstep-run or mpirun (tests/collectives/
// test_multiprocess_sync_bn.cpp, tests/gpu/test_cuda_sync_batch_norm.cpp):
// init_process_group() from the environment, then SyncBatchNorm against
// BatchNorm on the global batch for [N, C], [N, C, L] and [N, C, H, W]
// inputs, local batches of uneven size and, from 3 ranks on, one empty rank
// (checks and tolerance: tests/nn/sync_bn_check.h).
//
// Prints "sync_bn_worker rank R/N: OK (<cases> cases on <device>)" and exits
// 0, or prints every mismatch and exits 1. An exception exits at once
// (without waiting for the others), so the launcher or mpirun ends the job
// instead of a hang.
//
// Flags: --backend NAME   instead of LOCKSTEP_BACKEND / the default
//        --device cuda    SyncBatchNorm on cuda:<local rank % devices> (so
//                         ranks may share one GPU), against the CPU
//                         reference; device memory is poisoned (NaN) first,
//                         so an element never written fails the check
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lockstep/collectives/init.h"
#include "lockstep/config.h"
#include "nn/sync_bn_check.h"

#if LOCKSTEP_HAVE_CUDA
#include <optional>

#include "lockstep/runtime/cuda/caching_allocator.h"
#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/device_guard.h"
#include "lockstep/distributed/launch_env.h"
#endif

namespace lc = lockstep::collectives;
namespace lt = lockstep::testing;
using lockstep::runtime::DType;

namespace {

struct Flags {
  std::string backend;
  bool cuda = false;
};

Flags parse_flags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--backend" && i + 1 < argc) {
      flags.backend = argv[++i];
    } else if (arg == "--device" && i + 1 < argc && (argv[i + 1] == std::string("cuda") ||
                                                     argv[i + 1] == std::string("cpu"))) {
      flags.cuda = argv[++i] == std::string("cuda");
    } else {
      throw lockstep::Error(fmt::format("sync_bn_worker: unknown flag {} (expected --backend "
                                        "NAME or --device cpu|cuda)",
                                        arg));
    }
  }
  return flags;
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
    const Flags flags = parse_flags(argc, argv);
    lockstep::runtime::Device device = lockstep::runtime::Device::cpu();
#if LOCKSTEP_HAVE_CUDA
    // This rank's GPU is made current before the group exists: an NCCL
    // communicator lives on the current device.
    std::optional<lockstep::runtime::cuda::DeviceGuard> on_gpu;
    if (flags.cuda) {
      const int devices = lockstep::runtime::cuda_device_count();
      if (devices == 0)
        throw lockstep::Error("no CUDA device: " + lockstep::runtime::cuda_unavailable_reason());
      device = lockstep::runtime::Device::cuda(lockstep::distributed::read_rank_info().local_rank %
                                               devices);
      on_gpu.emplace(device.index);
      lockstep::runtime::cuda::set_poison_allocations(true);
    }
#else
    if (flags.cuda) throw lockstep::Error("--device cuda: lockstep was built without CUDA");
#endif
    lc::InitOptions options;
    options.backend = flags.backend;
    auto group = lc::init_process_group(options);
    who = fmt::format("sync_bn_worker rank {}/{}", group->rank(), group->size());
    std::vector<std::string> errors;
    auto all = cases(group->size());
    for (auto& c : all) c.device = device;
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
    std::printf("%s: OK (%zu cases on %s)\n", who.c_str(), all.size(), device.str().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: FAILED: %s\n", who.c_str(), e.what());
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(1);
  }
}
