// Training checkpoints of two models trained side by side on subgroups of one
// job ({0, 1} train model A, {2, 3} model B): each pair's rank 0 writes its
// own model's file and each pair resumes its own run; a save, a run opened or
// a checkpoint picked over the whole job's group, whose rank 0 decides and
// writes for all, is refused when the ranks name different directories.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <unistd.h>

#include "collectives/rank_threads.h"
#include "lockstep/collectives/new_group.h"
#include "lockstep/models/models.h"
#include "lockstep/runtime/checkpoint/checkpoint.h"
#include "lockstep/train/training_checkpoint.h"
#include "lockstep/train/training_run.h"
#include "support/backend_skip.h"

using namespace lockstep;
using Catch::Contains;
namespace fs = std::filesystem;

TEST_CASE("Two models on subgroups each save their own checkpoint; a save over the job's group "
          "naming two directories is refused on every rank",
          "[optim][checkpoint][new_group]") {
  const fs::path base =
      fs::temp_directory_path() / fmt::format("lockstep-tc-subgroups-{}", getpid());
  fs::remove_all(base);
  const bool over_job = GENERATE(false, true);
  INFO("save over the job's group: " << over_job);
  auto groups = testing::make_groups(testing::kThreadRankBackend, 4, "ckpt-subgroups");
  std::vector<fs::path> saved(4);
  const auto errors = testing::run_ranks(4, [&](int r) {
    auto& job = groups[static_cast<size_t>(r)];
    auto low = collectives::new_group(*job, {0, 1});
    auto high = collectives::new_group(*job, {2, 3});
    auto pair = r < 2 ? low : high;
    auto model = models::fashion_mlp(r < 2 ? 1 : 2);
    runtime::CheckpointDir dir(base / (r < 2 ? "A" : "B"));
    const train::TrainingParts parts{.model = model.get()};
    saved[static_cast<size_t>(r)] =
        train::save_training_checkpoint(dir, parts, {.step = 1}, std::nullopt,
                                        over_job ? *job : *pair)
            .path;
  });
  if (!over_job) {
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r);
      REQUIRE_FALSE(errors[static_cast<size_t>(r)]);
      const fs::path want = base / (r < 2 ? "A" : "B") / saved[static_cast<size_t>(r)].filename();
      CHECK(saved[static_cast<size_t>(r)] == want);
      REQUIRE(fs::is_regular_file(want));
      // Each file holds its own model's weights.
      const auto content = runtime::load_checkpoint(want);
      const auto expected = models::fashion_mlp(r < 2 ? 1 : 2)->state_dict();
      for (const auto& [name, t] : expected) {
        const auto it = std::find_if(content.tensors.begin(), content.tensors.end(),
                                     [&](const auto& e) { return e.first == "model." + name; });
        REQUIRE(it != content.tensors.end());
        CHECK(it->second.to_vector<float>() == t.to_vector<float>());
      }
    }
  } else {
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r);
      REQUIRE(errors[static_cast<size_t>(r)]);
      const std::string message = testing::message_of(errors[static_cast<size_t>(r)]);
      CHECK_THAT(message, Contains("different checkpoint directories"));
      CHECK_THAT(message, Contains((base / "B").string()));
    }
    // Refused before anything was written.
    int written = 0;
    for (const auto& e : fs::recursive_directory_iterator(base))
      written += e.path().extension() == ".safetensors" ? 1 : 0;
    CHECK(written == 0);
  }
  fs::remove_all(base);
}

TEST_CASE("Two models on subgroups each resume their own run; a run opened, or a checkpoint "
          "picked, over the job's group naming two directories is refused on every rank",
          "[optim][checkpoint][new_group]") {
  const fs::path base =
      fs::temp_directory_path() / fmt::format("lockstep-tc-subgroups-resume-{}", getpid());
  fs::remove_all(base);
  const bool over_job = GENERATE(false, true);
  const bool by_latest = GENERATE(false, true);
  INFO("resume over the job's group: " << over_job << ", with latest_training_checkpoint: "
                                        << by_latest);
  auto groups = testing::make_groups(testing::kThreadRankBackend, 4, "run-subgroups");
  std::vector<std::string> resumed(4);
  const auto errors = testing::run_ranks(4, [&](int r) {
    auto& job = groups[static_cast<size_t>(r)];
    auto low = collectives::new_group(*job, {0, 1});
    auto high = collectives::new_group(*job, {2, 3});
    auto pair = r < 2 ? low : high;
    auto model = models::fashion_mlp(r < 2 ? 1 : 2);
    const fs::path dir = base / (r < 2 ? "A" : "B");
    const train::TrainingParts parts{.model = model.get()};
    {
      // Model A saved step 1, model B steps 1 and 2.
      train::TrainingRun run = train::open_training_run(dir, {}, {}, *pair);
      for (int64_t step = 1; step <= (r < 2 ? 1 : 2); ++step)
        train::save_training_checkpoint(run.dir, parts, {.step = step}, std::nullopt, *pair);
    }
    job->barrier()->wait();
    auto& resume_group = over_job ? *job : *pair;
    std::optional<runtime::CheckpointEntry> from;
    if (by_latest) {
      from = train::latest_training_checkpoint(runtime::CheckpointDir(dir, {.read_only = true}),
                                               resume_group);
    } else {
      from = train::open_training_run(dir, {}, {.resume = true}, resume_group).resume_from;
    }
    resumed[static_cast<size_t>(r)] = from ? from->path.lexically_relative(base).string() : "none";
  });
  if (!over_job) {
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r);
      REQUIRE_FALSE(errors[static_cast<size_t>(r)]);
      CHECK(resumed[static_cast<size_t>(r)] ==
            (r < 2 ? "A/ckpt-0000000001.safetensors" : "B/ckpt-0000000002.safetensors"));
    }
  } else {
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r << " resumed " << resumed[static_cast<size_t>(r)]);
      REQUIRE(errors[static_cast<size_t>(r)]);
      const std::string message = testing::message_of(errors[static_cast<size_t>(r)]);
      CHECK_THAT(message, Contains(by_latest ? "latest_training_checkpoint" : "open_training_run") &&
                              Contains("different checkpoint directories"));
    }
  }
  fs::remove_all(base);
}
