// Started by lockstep-run (tests/gpu/test_cuda_ddp.cpp): DDP on CUDA tensors
// equals DDP on the CPU. Every rank trains the MLP and the CNN for 5 SGD steps
// (momentum 0.9) on its shard of one global batch twice, on its GPU (rank %
// device count, so two ranks may share one GPU) and on the CPU, over the same
// process group, then compares the parameters (within 1e-4 of the largest
// magnitude: cuBLAS and cuDNN sum in other orders) and checks that the CUDA
// parameters are bitwise identical on every rank, and that DDP's statistics
// are device times over NCCL and host times over the CPU backends. Prints
// "cuda_ddp_worker rank R/N: OK (<checks> checks)" or the failure, exit 1.
//
// Flags: --backend NAME  (gloo or shm stage CUDA tensors through host memory;
//                         nccl keeps them on the device)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lockstep/collectives/init.h"
#include "lockstep/config.h"
#include "lockstep/models/models.h"
#include "lockstep/nn/ddp/distributed_data_parallel.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/random.h"
#if LOCKSTEP_HAVE_CUDA
#include "lockstep/runtime/cuda/device.h"
#endif

namespace lc = lockstep::collectives;
namespace nn = lockstep::nn;
namespace models = lockstep::models;
namespace lr = lockstep::runtime;
using lr::Tensor;

namespace {

constexpr int kSteps = 5;

// This rank's shard of step `step`'s global batch (the same on every rank).
std::pair<Tensor, Tensor> shard(int step, int rank, int ranks, lr::Device device) {
  const int64_t per = 8, rows = per * ranks;
  lr::Generator g(1000 + step);
  Tensor x = lr::randn({rows, 1, 28, 28}, lr::DType::f32, g);
  std::vector<int64_t> y(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) y[static_cast<size_t>(i)] = (i * 7 + step) % 10;
  Tensor labels = Tensor::from_vector(y, {rows});
  return {x.slice(0, rank * per, (rank + 1) * per).contiguous().to(device),
          labels.slice(0, rank * per, (rank + 1) * per).contiguous().to(device)};
}

// Parameters after kSteps of DDP training on `device`, back on the CPU.
// Without a group (the CPU reference of an NCCL run at world size 1, where
// DDP changes nothing) the model trains alone.
// `stats`, when given, receives DDP's statistics of the last step.
// (Unused in builds without CUDA, where main only says so.)
[[maybe_unused]] std::vector<Tensor> train(const std::shared_ptr<lc::ProcessGroup>& group, int rank, int ranks,
                          bool cnn, lr::Device device, nn::DdpStats* stats = nullptr) {
  // Ranks start from different weights: DDP broadcasts rank 0's.
  std::shared_ptr<nn::Module> model =
      cnn ? std::shared_ptr<nn::Module>(models::fashion_cnn(7 + rank))
          : std::shared_ptr<nn::Module>(models::fashion_mlp(7 + rank));
  model->to(device);
  std::shared_ptr<nn::Module> wrapped = model;
  std::shared_ptr<nn::DistributedDataParallel> ddp;
  if (group) wrapped = ddp = std::make_shared<nn::DistributedDataParallel>(model, group);
  lockstep::optim::SGD sgd(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = shard(step, rank, ranks, device);
    sgd.zero_grad();
    lr::cross_entropy(wrapped->forward(x), y).backward();
    sgd.step();
  }
  if (stats && ddp) *stats = ddp->stats();
  std::vector<Tensor> out;
  for (const Tensor& p : model->parameters()) out.push_back(p.detach().to(lr::Device::cpu()));
  return out;
}

[[noreturn]] void fail(const std::string& why) { throw lockstep::Error("FAILED: " + why); }

}  // namespace

int main(int argc, char** argv) {
  int rank = -1;
  try {
    lc::InitOptions options;
    for (int i = 1; i + 1 < argc; i += 2) {
      if (std::strcmp(argv[i], "--backend") == 0) options.backend = argv[i + 1];
      else fail(fmt::format("unknown flag {}", argv[i]));
    }
#if LOCKSTEP_HAVE_CUDA
    auto group = lc::init_process_group(options);
    rank = group->rank();
    const int devices = lr::cuda_device_count();
    if (devices == 0) fail("no CUDA device: " + lr::cuda_unavailable_reason());
    const lr::Device gpu = lr::Device::cuda(rank % devices);
    int checks = 0;
    for (bool cnn : {false, true}) {
      const char* model = cnn ? "cnn" : "mlp";
      const bool nccl = group->backend() == "nccl";
      if (nccl && group->size() > 1) fail("the NCCL run compares at world size 1 only");
      nn::DdpStats stats;
      const auto on_gpu = train(group, rank, group->size(), cnn, gpu, &stats);
      // Over NCCL the host only launches: the times must come from device
      // events, and the exposed part lies within the communication. NCCL at
      // world size 1 returns an in-place all-reduce without launching
      // anything, so its events may read 0 ms.
      if (stats.device_clock != nccl) fail(fmt::format("{}: device_clock is wrong: {}", model, stats.str()));
      const bool comm_ok = nccl && group->size() == 1 ? stats.comm_ms >= 0 : stats.comm_ms > 0;
      if (!(stats.backward_ms > 0 && comm_ok && stats.exposed_comm_ms >= 0 &&
            stats.exposed_comm_ms <= stats.comm_ms + 0.05))
        fail(fmt::format("{}: implausible DDP times: {}", model, stats.str()));
      ++checks;
      const auto on_cpu = train(nccl ? nullptr : group, rank, group->size(), cnn, lr::Device::cpu());
      for (size_t t = 0; t < on_cpu.size(); ++t) {
        const auto a = on_gpu[t].to_vector<double>(), b = on_cpu[t].to_vector<double>();
        double scale = 0;
        for (double v : b) scale = std::max(scale, std::abs(v));
        for (size_t i = 0; i < a.size(); ++i)
          if (!(std::abs(a[i] - b[i]) <= 1e-4 * scale))
            fail(fmt::format("{} parameter {} [{}]: CUDA {} vs CPU {}", model, t, i, a[i], b[i]));
        ++checks;
        if (nccl) continue;  // one rank
        // Bitwise the same on every rank: rank 0's bytes, broadcast (on the CPU).
        Tensor root = on_gpu[t].clone();
        group->broadcast(root, {.root = 0})->wait();
        if (std::memcmp(root.raw_data(), on_gpu[t].raw_data(),
                        root.numel() * root.element_size()) != 0)
          fail(fmt::format("{} parameter {} differs from rank 0's", model, t));
        ++checks;
      }
    }
    std::printf("cuda_ddp_worker rank %d/%d: OK (%d checks, backend %s)\n", rank, group->size(),
                checks, group->backend().c_str());
    return 0;
#else
    fail("lockstep was built without CUDA");
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_ddp_worker rank %d: %s\n", rank, e.what());
    return 1;
  }
}
