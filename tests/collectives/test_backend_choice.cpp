// The default backend over injected layouts (backend_choice.h), and
// init_process_group() choosing it from every rank's device through a store,
// ranks as threads.
#include <catch2/catch.hpp>

#include <thread>

#include <fmt/format.h>

#include "lockstep/collectives/backend_choice.h"
#include "lockstep/collectives/init.h"
#include "lockstep/distributed/store/memory_store.h"
#include "support/test_util.h"

using namespace lockstep;
using collectives::choose_default_backend;
using collectives::RankPlacement;
using runtime::Device;
using lockstep::testing::error_of;
using Catch::Matchers::Contains;

namespace {

RankPlacement cpu(const std::string& node) { return {node, Device::cpu()}; }
RankPlacement gpu(const std::string& node, int index) { return {node, Device::cuda(index)}; }
// A GPU known by its physical identity, as DeviceBackend::physical_id gives it.
RankPlacement gpu(const std::string& node, int index, const std::string& id) {
  return {node, Device::cuda(index), id};
}

constexpr const char* kGpuA = "GPU-8a1b2c3d-0000-1111-2222-333344445555";
constexpr const char* kGpuB = "GPU-9f8e7d6c-0000-1111-2222-333344445555";

distributed::RankInfo rank_info(int rank, int size) {
  distributed::RankInfo info;
  info.rank = info.local_rank = rank;
  info.world_size = info.local_world_size = size;
  return info;
}

}  // namespace

TEST_CASE("CPU ranks: shm on one node, shm+gloo across nodes", "[collectives][backend_choice]") {
  CHECK(choose_default_backend({cpu("a")}, true).backend == "shm");
  CHECK(choose_default_backend({cpu("a"), cpu("a")}, true).backend == "shm");
  const auto two_nodes = choose_default_backend({cpu("a"), cpu("b")}, true);
  CHECK(two_nodes.backend == "shm+gloo");
  CHECK(two_nodes.note.empty());
}

TEST_CASE("A GPU per rank: nccl, on one node or several", "[collectives][backend_choice]") {
  CHECK(choose_default_backend({gpu("a", 0)}, true).backend == "nccl");
  const auto one_node = choose_default_backend({gpu("a", 0), gpu("a", 1)}, true);
  CHECK(one_node.backend == "nccl");
  CHECK(one_node.note.empty());
  // The same index on different nodes is a different GPU.
  CHECK(choose_default_backend({gpu("a", 0), gpu("b", 0)}, true).backend == "nccl");
}

TEST_CASE("Ranks sharing a GPU, or no NCCL: staged CPU backends, with a note",
          "[collectives][backend_choice]") {
  const auto shared = choose_default_backend({gpu("a", 0), gpu("a", 1), gpu("a", 0)}, true);
  CHECK(shared.backend == "shm");
  CHECK_THAT(shared.note, Contains("ranks 0, 2 share cuda:0") &&
                              Contains("NCCL needs one GPU per rank") &&
                              Contains("over shm with CUDA tensors staged through host memory"));
  const auto across = choose_default_backend({gpu("a", 0), gpu("a", 0), gpu("b", 0)}, true);
  CHECK(across.backend == "shm+gloo");
  CHECK_THAT(across.note, Contains("share cuda:0 of one node"));
  const auto no_nccl = choose_default_backend({gpu("a", 0), gpu("a", 1)}, false);
  CHECK(no_nccl.backend == "shm");
  CHECK_THAT(no_nccl.note, Contains("no NCCL"));
}

TEST_CASE("Ranks that each see their own GPU as cuda:0 are told apart by its identity",
          "[collectives][backend_choice]") {
  // Slurm's --gpus-per-task, or torchrun with one CUDA_VISIBLE_DEVICES per
  // worker: every rank's GPU is cuda:0. Before, they were taken as sharing it.
  const auto own = choose_default_backend({gpu("a", 0, kGpuA), gpu("a", 0, kGpuB)}, true);
  CHECK(own.backend == "nccl");
  CHECK(own.note.empty());
  CHECK(choose_default_backend({gpu("a", 0, kGpuA), gpu("a", 0, kGpuB), gpu("b", 0, kGpuA),
                                gpu("b", 0, kGpuB)},
                               true)
            .backend == "nccl");

  // One GPU, whatever index each rank knows it by: shared, and the note names it.
  const auto shared =
      choose_default_backend({gpu("a", 0, kGpuA), gpu("a", 0, kGpuB), gpu("a", 1, kGpuA)}, true);
  CHECK(shared.backend == "shm");
  CHECK_THAT(shared.note, Contains(fmt::format("ranks 0, 2 share {}, and NCCL needs", kGpuA)) &&
                              Contains("over shm with CUDA tensors staged through host memory"));
  const auto across = choose_default_backend(
      {gpu("a", 0, kGpuA), gpu("a", 0, kGpuA), gpu("b", 0, kGpuB)}, true);
  CHECK(across.backend == "shm+gloo");
  CHECK_THAT(across.note, Contains(fmt::format("ranks 0, 1 share {} of one node", kGpuA)));

  // A rank without an identity (none could be read): every rank's index decides.
  const auto partly = choose_default_backend({gpu("a", 0, kGpuA), gpu("a", 0)}, true);
  CHECK(partly.backend == "shm");
  CHECK_THAT(partly.note, Contains("ranks 0, 1 share cuda:0"));
  CHECK(choose_default_backend({gpu("a", 0, kGpuA), gpu("a", 1)}, true).backend == "nccl");
}

TEST_CASE("A rank's published placement reads back as it was written",
          "[collectives][backend_choice]") {
  using collectives::format_placement;
  using collectives::parse_placement;
  using collectives::PublishedPlacement;
  const auto round_trip = [](const PublishedPlacement& entry) {
    const std::string line = format_placement(entry);
    INFO(line);
    const PublishedPlacement back = parse_placement(line);
    CHECK(back.asked == entry.asked);
    CHECK(back.placement.node == entry.placement.node);
    CHECK(back.placement.device == entry.placement.device);
    CHECK(back.placement.gpu_id == entry.placement.gpu_id);
  };
  round_trip({"", gpu("node a:host-1", 3, kGpuA)});
  round_trip({"", gpu("n", 0, "0000:65:00.0")});
  round_trip({"", gpu("n", 1)});
  round_trip({"", cpu("n")});
  round_trip({"", cpu("")});
  round_trip({"gloo", cpu("n")});
  CHECK(format_placement({"", gpu("n", 0, kGpuA)}) == fmt::format("- cuda:0 {} n", kGpuA));
  CHECK(format_placement({"", gpu("n x", 2)}) == "- cuda:2 - n x");
  // A rank that asked for a backend does not publish its device.
  CHECK(format_placement({"nccl", gpu("n", 1, kGpuA)}) == "nccl - - n");
  CHECK(parse_placement("nccl - - n").placement.device == Device::cpu());
  // Three fields: what a build from before GPU identities published.
  CHECK_THAT(error_of([] { parse_placement("- cuda:0 n"); }),
             Contains("a rank published '- cuda:0 n' where") &&
                 Contains("same build of lockstep"));
}

TEST_CASE("Some ranks on GPUs and others on the CPU is an error naming them",
          "[collectives][backend_choice]") {
  const std::string e = error_of(
      [] { choose_default_backend({gpu("a", 0), cpu("a"), gpu("a", 1), cpu("b")}, true); });
  CHECK_THAT(e, Contains("ranks 1, 3 compute on the CPU and ranks 0, 2 on GPUs") &&
                    Contains("--device cpu"));
  CHECK_THAT(error_of([] { choose_default_backend({cpu("a"), gpu("a", 0)}, true); }),
             Contains("rank 0 computes on the CPU and rank 1 on GPUs"));
}

TEST_CASE("init_process_group's default follows every rank's device, the same on each",
          "[collectives][backend_choice]") {
  auto store = std::make_shared<distributed::MemoryStore>();
  constexpr int kRanks = 2;
  std::string errors[kRanks];
  std::string backends[kRanks];
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      const distributed::RankInfo info = rank_info(r, kRanks);
      // Rank 1 on a GPU, rank 0 on the CPU: both refuse, naming the ranks.
      const Device device = r == 1 ? Device::cuda(0) : Device::cpu();
      try {
        auto group = collectives::init_process_group(
            {.name = "mixed", .device = device, .rank_info = info, .store = store});
        backends[r] = group->backend();
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r << ": " << backends[r]);
    CHECK_THAT(errors[r], Contains("rank 0 computes on the CPU and rank 1 on GPUs"));
  }

  // Every rank on the CPU: shm, as before devices were asked.
  threads.clear();
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      const distributed::RankInfo info = rank_info(r, kRanks);
      auto group = collectives::init_process_group(
          {.name = "cpu", .device = Device::cpu(), .rank_info = info, .store = store});
      backends[r] = group->backend();
    });
  }
  for (auto& t : threads) t.join();
  CHECK(backends[0] == "shm");
  CHECK(backends[1] == "shm");
}

TEST_CASE("Ranks that ask for different backends are refused, naming who asked for what",
          "[collectives][backend_choice]") {
  using collectives::agreed_backend;
  CHECK(agreed_backend({"", ""}, "g").empty());
  CHECK(agreed_backend({"gloo", "gloo", "gloo"}, "g") == "gloo");
  CHECK_THAT(error_of([] { agreed_backend({"", "shm", "", "gloo"}, "g"); }),
             Contains("group 'g': the ranks ask for different backends: ranks 0, 2: the "
                      "default (none asked for); rank 1: shm; rank 3: gloo") &&
                 Contains("LOCKSTEP_BACKEND"));
}

TEST_CASE("init_process_group fails at once on every rank where LOCKSTEP_BACKEND differs",
          "[collectives][backend_choice]") {
  // Before, each rank waited for the others in its own rendezvous until the
  // timeout, and the error said that a rank had not started.
  auto store = std::make_shared<distributed::MemoryStore>();
  constexpr int kRanks = 3;
  std::string errors[kRanks];
  std::vector<std::thread> threads;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      distributed::RankInfo info = rank_info(r, kRanks);
      if (r == 2) info.backend = "shm";
      errors[r] = error_of([&] {
        collectives::init_process_group(
            {.timeout = std::chrono::seconds(20), .name = "asked", .rank_info = info,
             .store = store});
      });
    });
  }
  for (auto& t : threads) t.join();
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    CHECK_THAT(errors[r], Contains("group 'asked': the ranks ask for different backends: "
                                   "ranks 0, 1: the default (none asked for); rank 2: shm"));
  }

  // Asked alike on every rank: that backend.
  std::string backends[kRanks];
  threads.clear();
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      distributed::RankInfo info = rank_info(r, kRanks);
      info.backend = "shm";
      backends[r] = collectives::init_process_group(
                        {.name = "alike", .rank_info = info, .store = store})->backend();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) CHECK(backends[r] == "shm");
}
