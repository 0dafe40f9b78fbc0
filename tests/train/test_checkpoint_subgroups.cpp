// Training checkpoints of two models trained side by side on subgroups of one
// job ({0, 1} train model A, {2, 3} model B): each pair's rank 0 writes its
// own model's file, and a save over the whole job's group, whose rank 0
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
