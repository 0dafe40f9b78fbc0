// Activation checkpointing on CUDA: a GPT with every block checkpointed gives
// the plain model's loss and gradients bit for bit (dropout on, so the
// recomputation must replay the generator's draws), and its forward holds
// less device memory at its peak. The embedding tables' gradients are the
// exception: CUDA's embedding backward adds a row's repeats with atomics, in
// no fixed order, so they agree to rounding (as two plain runs do).
#include <catch2/catch.hpp>

#include <string>

#include "gpu/cuda_op_check.h"
#include "lockstep/models/models.h"
#include "lockstep/runtime/device_backend.h"
#include "support/gpu_skip.h"
#include "support/tokens.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
namespace nn = lockstep::nn;
namespace models = lockstep::models;

TEST_CASE("CUDA activation checkpointing: the GPT's gradients equal the plain ones, in less memory",
          "[gpu][cuda][checkpoint]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  const auto [idx_cpu, targets_cpu] = tokens(8, 128, 64, 3);
  const Tensor idx = idx_cpu.to(cuda0()), targets = targets_cpu.to(cuda0());
  const DeviceBackend& backend = device_backend(cuda0());
  struct Result {
    std::vector<std::string> names;
    std::vector<Tensor> values;  // the loss, then every gradient
    size_t forward_peak = 0;
  };
  auto run = [&](bool checkpointed) {
    const models::GptConfig config{.vocab_size = 64, .block_size = 128, .n_layer = 4, .n_head = 4,
                               .n_embd = 128, .dropout = 0.1, .checkpoint_blocks = checkpointed};
    auto model = models::gpt(config, 7);
    model->to(cuda0());
    default_generator().manual_seed(11);
    backend.synchronize(cuda0());
    backend.reset_peak_memory(cuda0());
    Tensor loss = model->forward_values({idx, targets}).tensor(1);
    backend.synchronize(cuda0());
    Result r;
    r.forward_peak = backend.peak_allocated_bytes(cuda0());
    loss.backward();
    r.names.push_back("loss");
    r.values.push_back(loss.detach());
    for (const auto& [name, p] : model->named_parameters()) {
      r.names.push_back(name);
      r.values.push_back(p.grad());
    }
    return r;
  };
  const Result plain = run(false), checkpointed = run(true);
  REQUIRE(plain.values.size() == checkpointed.values.size());
  for (size_t i = 0; i < plain.values.size(); ++i) {
    const std::string& name = plain.names[i];
    if (name.find(".wte.") != std::string::npos || name.find(".wpe.") != std::string::npos)
      check_close_to(checkpointed.values[i], plain.values[i], 1e-5, 1e-7, name);
    else
      check_equal_to(checkpointed.values[i], plain.values[i], name);
  }
  INFO("forward peak: plain " << plain.forward_peak << " bytes, checkpointed "
                              << checkpointed.forward_peak);
  CHECK(checkpointed.forward_peak < plain.forward_peak);
}
