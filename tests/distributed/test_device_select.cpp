// Device selection: the decision over injected GPU inventories (local rank to
// GPU, round-robin sharing, CUDA_VISIBLE_DEVICES in messages, a build without
// CUDA), and select_device() on this machine through an injected environment.
#include <catch2/catch.hpp>

#include <map>

#include "lockstep/distributed/device_select.h"
#include "support/env_lookup.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::distributed;
using lockstep::testing::env_lookup;
using lockstep::testing::error_of;
using Catch::Matchers::Contains;

namespace {

GpuInventory gpus(int count) { return {.cuda_built = true, .count = count}; }

DeviceContext on(int local_rank, int local_world_size, GpuInventory inventory,
                 std::optional<std::string> visible = std::nullopt) {
  return {local_rank, local_world_size, std::move(inventory), std::move(visible)};
}

DeviceChoice choose(const std::string& text, const DeviceContext& context) {
  return choose_device({.text = text, .origin = "--device"}, context);
}

std::string refusal(const std::string& text, const DeviceContext& context) {
  return error_of([&] { choose(text, context); });
}

}  // namespace

TEST_CASE("auto and cuda put each local rank on its own GPU", "[device]") {
  for (const char* text : {"auto", "cuda"}) {
    INFO(text);
    for (int r = 0; r < 8; ++r) {
      const DeviceChoice c = choose(text, on(r, 8, gpus(8)));
      CHECK(c.device == Device::cuda(r));
      CHECK(c.note.empty());
    }
    // Fewer ranks than GPUs: the first ones.
    CHECK(choose(text, on(1, 2, gpus(4))).device == Device::cuda(1));
  }
}

TEST_CASE("More local ranks than GPUs share them round-robin, with a note", "[device]") {
  for (int r = 0; r < 4; ++r) {
    const DeviceChoice c = choose("auto", on(r, 4, gpus(2), "2,3"));
    CHECK(c.device == Device::cuda(r % 2));
    CHECK_THAT(c.note, Contains("4 ranks on this node share 2 GPUs") &&
                           Contains("CUDA_VISIBLE_DEVICES='2,3'") && Contains("round-robin"));
  }
  CHECK_THAT(choose("cuda", on(1, 3, gpus(1))).note, Contains("share 1 GPU round-robin"));
}

TEST_CASE("auto without a GPU is the CPU; cpu is the CPU whatever the machine has", "[device]") {
  CHECK(choose("auto", on(0, 1, gpus(0))).device == Device::cpu());
  CHECK(choose("auto", on(1, 2, GpuInventory{})).device == Device::cpu());  // no CUDA built
  CHECK(choose("cpu", on(3, 4, gpus(4))).device == Device::cpu());
  CHECK(choose("cpu", on(0, 1, GpuInventory{})).note.empty());
}

TEST_CASE("cuda:N picks visible GPU N on every rank", "[device]") {
  CHECK(choose("cuda:1", on(0, 1, gpus(2))).device == Device::cuda(1));
  const DeviceChoice shared = choose("cuda:0", on(1, 2, gpus(2)));
  CHECK(shared.device == Device::cuda(0));
  CHECK_THAT(shared.note, Contains("all 2 ranks on this node use cuda:0"));
  CHECK_THAT(refusal("cuda:2", on(0, 1, gpus(2), "4,5")),
             Contains("--device cuda:2: 2 GPUs are visible (CUDA_VISIBLE_DEVICES='4,5'), "
                      "cuda:0 to cuda:1"));
  CHECK_THAT(refusal("cuda:1", on(0, 1, gpus(1))), Contains("1 GPU is visible"));
}

TEST_CASE("A request that cannot be met says what is missing", "[device]") {
  SECTION("no CUDA in this build") {
    for (const char* text : {"cuda", "cuda:0"}) {
      CHECK_THAT(refusal(text, on(0, 1, GpuInventory{})),
                 Contains(std::string("--device ") + text +
                          ": this build of lockstep has no CUDA (configure with "
                          "-DLOCKSTEP_CUDA=ON") &&
                     Contains("or use --device cpu"));
    }
  }
  SECTION("no GPU visible") {
    GpuInventory none = gpus(0);
    none.unavailable_reason = "no CUDA device found (no CUDA-capable device is detected)";
    CHECK_THAT(refusal("cuda", on(0, 1, none, "")),
               Contains("--device cuda: no GPU visible (CUDA_VISIBLE_DEVICES=''): no CUDA "
                        "device found (no CUDA-capable device is detected)"));
    none.unavailable_reason = "no CUDA device found (CUDA driver version is insufficient)";
    CHECK_THAT(refusal("cuda", on(0, 1, none)),
               Contains("--device cuda: no CUDA device found (CUDA driver version is "
                        "insufficient); run on a machine with a GPU, or use --device cpu"));
  }
  SECTION("not a device") {
    for (const char* text : {"gpu", "cuda:", "cuda:-1", "cuda:x", "CPU", ""})
      CHECK_THAT(refusal(text, on(0, 1, gpus(1))),
                 Contains("not a device; use auto, cpu, cuda or cuda:N"));
  }
  SECTION("the variable is named when the request came from it") {
    const std::string e = error_of([] {
      choose_device({.text = "cuda", .origin = "LOCKSTEP_DEVICE"}, on(0, 1, GpuInventory{}));
    });
    CHECK_THAT(e, Contains("LOCKSTEP_DEVICE=cuda: this build") &&
                      Contains("or use LOCKSTEP_DEVICE=cpu"));
  }
}

TEST_CASE("select_device on this machine: the request, LOCKSTEP_DEVICE, then auto", "[device]") {
  const GpuInventory here = probe_gpus();
  const auto two_ranks = [](std::map<std::string, std::string> vars) {
    vars.insert({{"LOCKSTEP_RANK", "1"}, {"LOCKSTEP_WORLD_SIZE", "2"}, {"LOCKSTEP_LOCAL_RANK", "1"},
                 {"LOCKSTEP_LOCAL_WORLD_SIZE", "2"}, {"LOCKSTEP_STORE_ADDR", "127.0.0.1:1"}});
    return env_lookup(std::move(vars));
  };
  CHECK(select_device({.request = "cpu", .env = two_ranks({})}) == Device::cpu());
  CHECK(select_device({.env = two_ranks({{"LOCKSTEP_DEVICE", "cpu"}})}) == Device::cpu());
  // The argument wins over the variable.
  CHECK(select_device({.request = "cpu", .env = two_ranks({{"LOCKSTEP_DEVICE", "cuda"}})}) ==
        Device::cpu());
  CHECK_THAT(error_of([&] { select_device({.env = two_ranks({{"LOCKSTEP_DEVICE", "tpu"}})}); }),
             Contains("LOCKSTEP_DEVICE=tpu: not a device"));

  const Device automatic = select_device({.env = two_ranks({{"LOCKSTEP_DEVICE", ""}})});
  if (here.count == 0) {
    CHECK(automatic == Device::cpu());
    CHECK_THAT(error_of([&] { select_device({.request = "cuda", .env = two_ranks({})}); }),
               Contains("--device cuda: ") && Contains("--device cpu"));
  } else {
    CHECK(automatic == Device::cuda(1 % here.count));
  }
}
