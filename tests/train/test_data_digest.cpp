// The identity of a run's data (data_digest.h) and how a resume checks it
// (record_run_settings): other data under the same path is refused, naming
// both digests; a checkpoint saved before digests were recorded resumes and
// records one from then on. End to end through gpt_train: test_gpt_train.cpp.
#include <catch2/catch.hpp>

#include <filesystem>

#include "collectives/rank_threads.h"
#include "lockstep/models/models.h"
#include "lockstep/train/data_digest.h"
#include "lockstep/train/training_checkpoint.h"
#include "lockstep/train/training_run.h"
#include "support/backend_skip.h"
#include "support/temp_dir.h"
#include "support/test_util.h"

using namespace lockstep;
using namespace lockstep::train;
using lockstep::testing::TempDir;
using Catch::Contains;
using runtime::Tensor;
namespace fs = std::filesystem;

namespace {

const runtime::CheckpointDirOptions kQuiet{.keep_last = 2, .warn = [](const std::string&) {}};

std::string digest_of(const std::string& train, const std::string& validation) {
  return DataDigest().add("train", train).add("validation", validation).hex();
}

RunSettings settings_with(const std::string& digest) {
  RunSettings s{.fixed = {{"model", "mlp"}, {kDataSetting, "/srv/fortunes"}},
                .changeable = {{"lr", "0.1"}}};
  if (!digest.empty()) s.fixed[kDataDigestSetting] = digest;
  return s;
}

// A run that saved step 3 with `s`.
void saved_run(const fs::path& dir, const RunSettings& s) {
  TrainingRun run = open_training_run(dir, kQuiet, {}, testing::one_rank_group());
  record_run_settings(run, s);
  auto model = models::fashion_mlp(1);
  save_training_checkpoint(run.dir, {.model = model.get()}, {.step = 3}, std::nullopt,
                           testing::one_rank_group());
}

}  // namespace

TEST_CASE("A data digest tells apart data that differs in any byte, split, shape or dtype",
          "[checkpoint][run][data]") {
  const std::string base = digest_of("one\n%\ntwo\n%\n", "three\n%\n");
  CHECK(base.size() == 16);
  CHECK(base == digest_of("one\n%\ntwo\n%\n", "three\n%\n"));       // deterministic
  CHECK(base != digest_of("one\n%\ntwo\n%\n", "thref\n%\n"));       // one byte
  CHECK(base != digest_of("one\n%\n", "two\n%\nthree\n%\n"));       // another split
  CHECK(base !=  // the same parts in another order
        DataDigest().add("validation", "three\n%\n").add("train", "one\n%\ntwo\n%\n").hex());

  const Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  const std::string t = DataDigest().add("x", x).hex();
  CHECK(t == DataDigest().add("x", Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3})).hex());
  CHECK(t != DataDigest().add("x", x.reshape({3, 2})).hex());
  CHECK(t != DataDigest().add("x", Tensor::from_vector<float>({1, 2, 3, 4, 5, 7}, {2, 3})).hex());
  CHECK(t != DataDigest().add("x", Tensor::from_vector<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3})).hex());
  // Values, not layout: a transposed view digests as its contiguous copy.
  CHECK(DataDigest().add("x", x.transpose(0, 1)).hex() ==
        DataDigest().add("x", x.transpose(0, 1).contiguous()).hex());
}

TEST_CASE("A resume on other data under the same path is refused, naming both digests",
          "[checkpoint][run][data]") {
  TempDir tmp;
  const fs::path dir = tmp.file("data");
  const std::string then = digest_of("one\n%\n", "two\n%\n");
  const std::string now = digest_of("one\n%\n", "2\n%\n");
  saved_run(dir, settings_with(then));

  TrainingRun same = open_training_run(dir, kQuiet, {.resume = true}, testing::one_rank_group());
  CHECK(record_run_settings(same, settings_with(then)).empty());
  CHECK(same.notes.empty());

  TrainingRun other = open_training_run(dir, kQuiet, {.resume = true}, testing::one_rank_group());
  const std::string message =
      testing::error_of([&] { record_run_settings(other, settings_with(now)); });
  CHECK_THAT(message, Contains(other.resume_from->path.string()) &&
                          Contains("The data under /srv/fortunes is not the data this run "
                                   "started with: digest " + then + " then, " + now + " now") &&
                          Contains("another checkpoint directory") &&
                          Contains("original data back under /srv/fortunes"));

  // With other settings changed too, the digest may differ only because they
  // load other data: the files are not blamed.
  TrainingRun also = open_training_run(dir, kQuiet, {.resume = true}, testing::one_rank_group());
  RunSettings fewer = settings_with(now);
  fewer.fixed["train_samples"] = "2000";
  const std::string both = testing::error_of([&] { record_run_settings(also, fewer); });
  CHECK_THAT(both, Contains("train_samples: saved (not set), now 2000") &&
                       Contains("data_digest: saved " + then + ", now " + now) &&
                       Contains("may differ only because those settings load other data") &&
                       !Contains("is not the data this run started with"));
}

TEST_CASE("The same data under another path resumes: the path is a change the run records",
          "[checkpoint][run][data]") {
  // A run moved to another machine, its data copied to another path there.
  // The digest says the files are the ones the run started with; before, the
  // resume was refused as if continuing it would compute something else.
  TempDir tmp;
  const fs::path dir = tmp.file("moved");
  const std::string digest = digest_of("one\n%\n", "two\n%\n");
  saved_run(dir, settings_with(digest));
  RunSettings elsewhere = settings_with(digest);
  elsewhere.fixed[kDataSetting] = "/scratch/fortunes";

  TrainingRun run = open_training_run(dir, kQuiet, {.resume = true}, testing::one_rank_group());
  const auto changes = record_run_settings(run, elsewhere);
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].name == kDataSetting);
  CHECK(changes[0].saved == "/srv/fortunes");
  CHECK(changes[0].now == "/scratch/fortunes");
  CHECK(run.dir.run().metadata.at("run.fixed.data") == "/scratch/fortunes");

  // Other files under the new path are still refused, naming the path too.
  TrainingRun other = open_training_run(dir, kQuiet, {.resume = true}, testing::one_rank_group());
  RunSettings other_data = settings_with(digest_of("one\n%\n", "2\n%\n"));
  other_data.fixed[kDataSetting] = "/scratch/fortunes";
  CHECK_THAT(testing::error_of([&] { record_run_settings(other, other_data); }),
             Contains("data: saved /srv/fortunes, now /scratch/fortunes") &&
                 Contains("data_digest: saved " + digest));
}

TEST_CASE("A checkpoint saved without a data digest resumes and records one from then on",
          "[checkpoint][run][data]") {
  TempDir tmp;
  const fs::path dir = tmp.file("legacy");
  saved_run(dir, settings_with(""));  // as the version before digests saved it
  const std::string digest = digest_of("one\n%\n", "two\n%\n");

  // Another difference is refused as before, and not blamed on the data.
  TrainingRun cnn = open_training_run(dir, kQuiet, {.resume = true}, testing::one_rank_group());
  RunSettings other_model = settings_with(digest);
  other_model.fixed["model"] = "cnn";
  const std::string message = testing::error_of([&] { record_run_settings(cnn, other_model); });
  CHECK_THAT(message, Contains("model: saved mlp, now cnn") && !Contains("data"));

  TrainingRun run = open_training_run(dir, kQuiet, {.resume = true}, testing::one_rank_group());
  CHECK(record_run_settings(run, settings_with(digest)).empty());
  REQUIRE(run.notes.size() == 1);
  CHECK_THAT(run.notes[0], Contains("records no digest") && Contains("/srv/fortunes") &&
                               Contains(digest));
  CHECK(run.dir.run().metadata.at("run.fixed.data_digest") == digest);
  auto model = models::fashion_mlp(1);
  save_training_checkpoint(run.dir, {.model = model.get()}, {.step = 4}, std::nullopt,
                           testing::one_rank_group());

  // The next resume checks against it.
  TrainingRun later = open_training_run(dir, kQuiet, {.resume = true}, testing::one_rank_group());
  REQUIRE(later.resume_from->step == 4);
  CHECK_THAT(testing::error_of([&] {
               record_run_settings(later, settings_with(digest_of("one\n%\n", "3\n%\n")));
             }),
             Contains("digest " + digest + " then"));
}

TEST_CASE("Ranks that loaded different data are refused on every rank, naming each digest",
          "[checkpoint][run][data]") {
  auto groups = testing::make_groups(testing::kThreadRankBackend, 2, "data-digest");
  std::vector<std::string> agreed(2);
  const auto same = testing::run_ranks(2, [&](int r) {
    agreed[size_t(r)] =
        same_on_every_rank(DataDigest().add("train", "one"), "/d", *groups[size_t(r)]);
  });
  REQUIRE_FALSE(same[0]);
  REQUIRE_FALSE(same[1]);
  CHECK(agreed[0] == agreed[1]);

  const auto differ = testing::run_ranks(2, [&](int r) {
    same_on_every_rank(DataDigest().add("train", r == 0 ? "one" : "two"), "/d", *groups[size_t(r)]);
  });
  for (int r = 0; r < 2; ++r)
    CHECK_THAT(testing::message_of(differ[size_t(r)]),
               Contains("loaded different data from /d") && Contains("rank 0: ") &&
                   Contains("rank 1: "));
}
