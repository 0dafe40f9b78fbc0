// Checkpoints and CUDA: a model on a GPU saves (its tensors pass through the
// host) and a checkpoint loads onto a GPU, directly (LoadOptions::device) and
// into a model already on the device, bit for bit.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "gpu/cuda_op_check.h"
#include "lockstep/models/models.h"
#include "lockstep/runtime/checkpoint/checkpoint.h"
#include "support/gpu_skip.h"

using namespace lockstep;
using namespace lockstep::runtime;
using namespace lockstep::testing;

TEST_CASE("checkpoints save from and load onto a CUDA device bit for bit", "[gpu][cuda_checkpoint]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const auto dir = std::filesystem::temp_directory_path() / "lockstep_cuda_checkpoint_test";
  std::filesystem::create_directories(dir);
  const auto path = dir / "cnn.safetensors";

  auto source = models::fashion_cnn(5);
  source->to(cuda0());
  save_checkpoint(path, {.tensors = source->state_dict().items()});

  // Straight onto the device.
  const CheckpointContent loaded = load_checkpoint(path, {.device = cuda0()});
  const auto want = source->state_dict().items();
  REQUIRE(loaded.tensors.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    CHECK(loaded.tensors[i].second.device() == cuda0());
    check_equal_to(loaded.tensors[i].second, want[i].second, want[i].first);
  }

  // Into a model on the device that started from other weights.
  auto target = models::fashion_cnn(6);
  target->to(cuda0());
  const CheckpointContent host = load_checkpoint(path);
  target->load_state_dict(nn::StateDict(host.tensors));
  const auto got = target->state_dict().items();
  for (size_t i = 0; i < want.size(); ++i) {
    CHECK(got[i].second.device() == cuda0());
    check_equal_to(got[i].second, want[i].second, want[i].first);
  }
  std::filesystem::remove_all(dir);
}
