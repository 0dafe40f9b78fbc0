// A program whose main starts its ranks with collectives::spawn (as a
// PyTorch script calls mp.spawn), for tests/gpu/test_cuda_spawn.cpp: the
// parent touches no device, each child selects its own (select_device(), so
// two ranks on one GPU share it), joins the default group and all-reduces a
// tensor on its device. Each rank prints
// "spawn_worker rank R/N on DEVICE (BACKEND): OK"; a failure ends the job with
// spawn's error, exit 1.
//
// Flags: --nprocs N (default 2), --device auto|cpu|cuda|cuda:N (default auto)
#include <cstdio>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "lockstep/collectives/init.h"
#include "lockstep/collectives/spawn.h"
#include "lockstep/distributed/device_select.h"
#include "lockstep/runtime/tensor.h"

namespace lc = lockstep::collectives;
namespace lr = lockstep::runtime;

int main(int argc, char** argv) {
  try {
    int nprocs = 2;
    std::string device = "auto";
    for (int i = 1; i + 1 < argc; i += 2) {
      if (std::strcmp(argv[i], "--nprocs") == 0) nprocs = std::stoi(argv[i + 1]);
      else if (std::strcmp(argv[i], "--device") == 0) device = argv[i + 1];
      else throw lockstep::Error(fmt::format("unknown flag {}", argv[i]));
    }
    lc::spawn(nprocs, [&](int rank) {
      const lr::Device d = lockstep::distributed::select_device({.request = device});
      auto group = lc::init_process_group();
      lr::Tensor t = lr::Tensor::full({1000}, rank + 1.0, lr::DType::f32, d);
      group->allreduce(t)->wait();
      const double expected = nprocs * (nprocs + 1) / 2.0;
      for (double v : t.to(lr::Device::cpu()).to_vector<double>()) {
        if (v != expected)
          throw lockstep::Error(fmt::format("rank {}: all-reduce gave {}, expected {}", rank, v,
                                            expected));
      }
      std::printf("spawn_worker rank %d/%d on %s (%s): OK\n", rank, nprocs, d.str().c_str(),
                  group->backend().c_str());
    });
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "spawn_worker: %s\n", e.what());
    return 1;
  }
}
