// Training runs in one process and over two rank threads: what
// open_training_run decides for a new run, a restart and a resume, how
// record_run_settings checks a resume, and a learning rate that a resume
// changes. End to end through fashion_mnist: test_run_checkpoints.cpp.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "collectives/rank_threads.h"
#include "lockstep/models/models.h"
#include "lockstep/optim/lr_scheduler.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/train/training_checkpoint.h"
#include "lockstep/train/training_run.h"
#include "runtime/checkpoint/checkpoint_test_util.h"
#include "support/test_util.h"
#include "support/backend_skip.h"

using namespace lockstep;
using namespace lockstep::optim;
using namespace lockstep::train;
using lockstep::testing::TempDir;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

const runtime::CheckpointDirOptions kQuiet{.keep_last = 2, .warn = [](const std::string&) {}};

RunSettings settings(const std::string& model, const std::string& lr) {
  return {.fixed = {{"model", model}, {"batch_size", "64"}},
          .changeable = {{"lr", lr}, {"epochs", "2"}}};
}

// A run of one process that saved `steps` with `s`; returns its id.
std::string saved_run(const fs::path& dir, const RunSettings& s, std::vector<int64_t> steps) {
  TrainingRun run = open_training_run(dir, kQuiet, {}, testing::one_rank_group());
  record_run_settings(run, s);
  auto model = models::fashion_mlp(1);
  for (int64_t step : steps)
    save_training_checkpoint(run.dir, {.model = model.get()}, {.step = step}, std::nullopt, testing::one_rank_group());
  return run.dir.run().id;
}

}  // namespace

TEST_CASE("A run's id and settings ride in its checkpoints and survive a resume",
          "[optim][checkpoint][run]") {
  TempDir tmp;
  const fs::path dir = tmp.file("ids");
  const std::string id = saved_run(dir, settings("mlp", "0.05"), {10, 20});
  REQUIRE(id.size() == 16);
  for (const auto& e : runtime::CheckpointDir(dir).list()) CHECK(e.run_id == id);

  TrainingRun resumed = open_training_run(dir, kQuiet, {.resume = true}, testing::one_rank_group());
  REQUIRE(resumed.resume_from);
  CHECK(resumed.resume_from->step == 20);
  CHECK(resumed.run_id == id);
  REQUIRE(resumed.saved);
  CHECK(resumed.saved->fixed.at("world_size") == "1");
  CHECK(resumed.saved->changeable.at("lr") == "0.05");

  // An unchanged resume reports nothing; later saves keep the id and
  // retention goes on over the run's files (keep_last 2).
  CHECK(record_run_settings(resumed, settings("mlp", "0.05")).empty());
  auto model = models::fashion_mlp(1);
  save_training_checkpoint(resumed.dir, {.model = model.get()}, {.step = 30}, std::nullopt, testing::one_rank_group());
  std::vector<int64_t> steps;
  for (const auto& e : resumed.dir.list()) {
    steps.push_back(e.step);
    CHECK(e.run_id == id);
  }
  CHECK(steps == std::vector<int64_t>{20, 30});
  fs::remove_all(dir);
}

// A run started to keep its last 5 and resumed without saying how many: its
// next save used the program's default (2) and deleted three of the five.
TEST_CASE("A resume that does not choose keep_last keeps the run's; one that does is told the "
          "change",
          "[optim][checkpoint][run]") {
  TempDir tmp;
  const fs::path dir = tmp.file("keep");
  {
    runtime::CheckpointDirOptions five = kQuiet;
    five.keep_last = 5;
    TrainingRun run = open_training_run(dir, five, {}, testing::one_rank_group());
    record_run_settings(run, settings("mlp", "0.05"));
    auto model = models::fashion_mlp(1);
    for (int64_t step = 1; step <= 6; ++step)
      save_training_checkpoint(run.dir, {.model = model.get()}, {.step = step}, std::nullopt,
                               testing::one_rank_group());
  }
  const auto steps_after_save = [&](TrainingRun& run, int64_t step) {
    auto model = models::fashion_mlp(1);
    save_training_checkpoint(run.dir, {.model = model.get()}, {.step = step}, std::nullopt,
                             testing::one_rank_group());
    std::vector<int64_t> steps;
    for (const auto& e : run.dir.list()) steps.push_back(e.step);
    return steps;
  };
  {
    TrainingRun resumed = open_training_run(dir, kQuiet, {.resume = true, .keep_last_given = false},
                                            testing::one_rank_group());
    CHECK(resumed.dir.keep_last() == 5);
    CHECK(record_run_settings(resumed, settings("mlp", "0.05")).empty());
    CHECK(steps_after_save(resumed, 7) == std::vector<int64_t>{3, 4, 5, 6, 7});
  }
  TrainingRun chosen = open_training_run(dir, kQuiet, {.resume = true}, testing::one_rank_group());
  CHECK(chosen.dir.keep_last() == 2);
  const auto changes = record_run_settings(chosen, settings("mlp", "0.05"));
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].name == "keep_last");
  CHECK(changes[0].saved == "5");
  CHECK(changes[0].now == "2");
  CHECK(steps_after_save(chosen, 8) == std::vector<int64_t>{7, 8});
  fs::remove_all(dir);
}

TEST_CASE("A resume with other fixed settings is refused, naming each; changeable ones are returned",
          "[optim][checkpoint][run]") {
  TempDir tmp;
  const fs::path dir = tmp.file("settings");
  saved_run(dir, settings("mlp", "0.05"), {5});

  TrainingRun resumed = open_training_run(dir, kQuiet, {.resume = true}, testing::one_rank_group());
  RunSettings other = settings("cnn", "0.5");
  other.fixed["batch_size"] = "32";
  other.fixed["optimizer"] = "adam";
  const std::string message = testing::error_of([&] { record_run_settings(resumed, other); });
  CHECK_THAT(message, Contains(resumed.resume_from->path.string()) &&
                          Contains("model: saved mlp, now cnn") &&
                          Contains("batch_size: saved 64, now 32") &&
                          Contains("optimizer: saved (not set), now adam"));
  CHECK(message.find("lr:") == std::string::npos);  // a changeable setting is no reason

  TrainingRun again = open_training_run(dir, kQuiet, {.resume = true}, testing::one_rank_group());
  RunSettings changed = settings("mlp", "0.5");
  changed.changeable.erase("epochs");  // left out: keeps the saved 2
  const auto changes = record_run_settings(again, changed);
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].name == "lr");
  CHECK(changes[0].saved == "0.05");
  CHECK(changes[0].now == "0.5");
  CHECK(run_settings_metadata({.changeable = {{"epochs", "2"}}}).at("run.changeable.epochs") ==
        again.dir.run().metadata.at("run.changeable.epochs"));
  fs::remove_all(dir);
}

TEST_CASE("A new run refuses a directory with checkpoints; restart moves them aside",
          "[optim][checkpoint][run]") {
  TempDir tmp;
  const fs::path dir = tmp.file("refuse");
  const std::string old_id = saved_run(dir, settings("mlp", "0.05"), {100, 200});
  std::ofstream(dir / "ckpt-0000000300.safetensors") << "damaged";

  const std::string message = testing::error_of([&] { open_training_run(dir, kQuiet, {}, testing::one_rank_group()); });
  CHECK_THAT(message, Contains("already holds checkpoints of another run") &&
                          Contains("run " + old_id + ": 2 file(s), steps 100 to 200") &&
                          Contains("1 file(s) whose header does not read: ckpt-0000000300") &&
                          Contains("resume the run") && Contains("restart"));
  CHECK(runtime::CheckpointDir(dir).list().size() == 3);

  TrainingRun fresh = open_training_run(dir, kQuiet, {.restart = true}, testing::one_rank_group());
  CHECK_FALSE(fresh.resume_from);
  REQUIRE(fresh.notes.size() == 1);
  CHECK_THAT(fresh.notes[0], Contains("moved the 3 checkpoint file(s)"));
  CHECK(fresh.dir.list().empty());
  size_t moved = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename() != ".lockstep-run.lock") ++moved;
  CHECK(moved == 3);
  fs::remove_all(dir);
}

TEST_CASE("A resume where no checkpoint loads names every file; files of two runs are refused",
          "[optim][checkpoint][run]") {
  TempDir tmp;
  const fs::path dir = tmp.file("damaged");
  saved_run(dir, settings("mlp", "0.05"), {1, 2});
  runtime::CheckpointDir listing(dir);
  const std::string first = listing.path_for_step(1).string(), second = listing.path_for_step(2).string();

  SECTION("the newest does not load: the one before it, with a note") {
    testing::flip_bit(second, testing::data_offset_of(second) + 1);
    TrainingRun run = open_training_run(dir, kQuiet, {.resume = true}, testing::one_rank_group());
    REQUIRE(run.resume_from);
    CHECK(run.resume_from->step == 1);
    REQUIRE(run.notes.size() == 1);
    CHECK_THAT(run.notes[0], Contains(second) && Contains("fails its checksum"));
  }
  SECTION("none loads") {
    testing::flip_bit(second, testing::data_offset_of(second) + 1);
    fs::resize_file(first, 20);
    const std::string message =
        testing::error_of([&] { open_training_run(dir, kQuiet, {.resume = true}, testing::one_rank_group()); });
    CHECK_THAT(message, Contains("no checkpoint in " + dir.string() + " loads (2 file(s) tried)") &&
                            Contains(first + ": ") && Contains(second + ": ") &&
                            Contains("fails its checksum") && Contains("Nothing was changed"));
    CHECK(fs::exists(first));
    CHECK(fs::exists(second));
  }
  SECTION("two runs") {
    runtime::CheckpointDir other(dir, kQuiet);  // a second run, saved by hand
    other.save(testing::small_content(), 7);
    CHECK_THAT(testing::error_of([&] { open_training_run(dir, kQuiet, {.resume = true}, testing::one_rank_group()); }),
               Contains("holds checkpoints of 2 runs"));
  }
  fs::remove_all(dir);
}

TEST_CASE("A resume past a checkpoint cut off in its header moves it aside and saves that step "
          "again", "[optim][checkpoint][run]") {
  // A copy that stopped inside the header (or left the file empty): the file
  // no longer says whose it is, and the resumed run's save of its step used
  // to refuse it, after the training that led there.
  TempDir tmp;
  const fs::path dir = tmp.file("header-cut");
  saved_run(dir, settings("mlp", "0.05"), {1, 2});
  runtime::CheckpointDir listing(dir);
  const fs::path second = listing.path_for_step(2), third = listing.path_for_step(3);
  fs::resize_file(second, 20);
  std::ofstream(third).close();  // empty
  REQUIRE_FALSE(runtime::CheckpointDir(dir).list().back().unreadable.empty());

  TrainingRun run = open_training_run(dir, kQuiet, {.resume = true}, testing::one_rank_group());
  record_run_settings(run, settings("mlp", "0.05"));
  REQUIRE(run.resume_from);
  CHECK(run.resume_from->step == 1);
  REQUIRE(run.notes.size() == 3);  // two skipped, one move
  const fs::path aside = dir / "ckpt-unreadable";
  CHECK_THAT(run.notes[2], Contains("moved ckpt-0000000002.safetensors, "
                                    "ckpt-0000000003.safetensors into " + aside.string()));
  // Nothing deleted: both files kept as they were, out of the run's way.
  CHECK(fs::file_size(aside / second.filename()) == 20);
  CHECK(fs::file_size(aside / third.filename()) == 0);
  auto model = models::fashion_mlp(1);
  for (int64_t step : {2, 3})
    CHECK_NOTHROW(save_training_checkpoint(run.dir, {.model = model.get()}, {.step = step},
                                           std::nullopt, testing::one_rank_group()));
  CHECK_NOTHROW(runtime::load_checkpoint(third));
  fs::remove_all(dir);
}

TEST_CASE("A resume past a checkpoint cut off in its data saves that step again",
          "[optim][checkpoint][run]") {
  // As after copying the directory to another machine and the copy of the
  // newest file stopping short: its header still says whose it is.
  TempDir tmp;
  const fs::path dir = tmp.file("cut");
  const std::string id = saved_run(dir, settings("mlp", "0.05"), {1, 2});
  const std::string second = runtime::CheckpointDir(dir).path_for_step(2).string();
  fs::resize_file(second, fs::file_size(second) - 100);
  CHECK(runtime::CheckpointDir(dir).list().back().run_id == id);

  TrainingRun run = open_training_run(dir, kQuiet, {.resume = true}, testing::one_rank_group());
  record_run_settings(run, settings("mlp", "0.05"));
  REQUIRE(run.resume_from);
  CHECK(run.resume_from->step == 1);
  REQUIRE(run.notes.size() == 1);
  CHECK_THAT(run.notes[0], Contains(second) && Contains("truncated"));
  // The run's own cut-off file is replaced when the run gets there again;
  // before, the save refused it as a file of unknown owner, losing the work.
  auto model = models::fashion_mlp(1);
  save_training_checkpoint(run.dir, {.model = model.get()}, {.step = 2}, std::nullopt,
                           testing::one_rank_group());
  CHECK_NOTHROW(runtime::load_checkpoint(second));
  fs::remove_all(dir);
}

TEST_CASE("A checkpoint saved without a run id is adopted, with a note", "[optim][checkpoint][run]") {
  TempDir tmp;
  const fs::path dir = tmp.file("legacy");
  saved_run(dir, settings("mlp", "0.05"), {4});
  // As an earlier version wrote it: no run id and no settings.
  const fs::path file = runtime::CheckpointDir(dir).path_for_step(4);
  runtime::CheckpointContent c = runtime::load_checkpoint(file);
  for (auto it = c.metadata.begin(); it != c.metadata.end();)
    it = it->first == runtime::kRunKey || it->first.starts_with("run.") ? c.metadata.erase(it)
                                                                        : std::next(it);
  runtime::save_checkpoint(file, c);

  TrainingRun run = open_training_run(dir, kQuiet, {.resume = true}, testing::one_rank_group());
  REQUIRE(run.resume_from);
  CHECK(run.run_id.empty());
  CHECK_FALSE(run.saved);
  REQUIRE(run.notes.size() == 1);
  CHECK_THAT(run.notes[0], Contains("without a run id"));
  CHECK(record_run_settings(run, settings("cnn", "1")).empty());  // nothing to check against
  auto model = models::fashion_mlp(1);
  save_training_checkpoint(run.dir, {.model = model.get()}, {.step = 5}, std::nullopt, testing::one_rank_group());
  const auto entries = run.dir.list();
  REQUIRE(entries.size() == 2);
  CHECK_FALSE(entries[0].run_id);  // the adopted file stays as it was
  CHECK(entries[1].run_id == run.dir.run().id);
  fs::remove_all(dir);
}

TEST_CASE("Every rank agrees: a refusal on rank 0 stops both, a resume finds the same run",
          "[optim][checkpoint][run]") {
  TempDir tmp;
  const fs::path dir = tmp.file("ranks");
  auto groups = testing::make_groups(testing::kThreadRankBackend, 2, "training-run");
  std::vector<std::string> errors(2), ids(2), saved_lr(2);
  const auto first = testing::run_ranks(2, [&](int r) {
    TrainingRun run = open_training_run(dir, kQuiet, {}, *groups[size_t(r)]);
    record_run_settings(run, settings("mlp", "0.05"));
    auto model = models::fashion_mlp(1);
    save_training_checkpoint(run.dir, {.model = model.get()}, {.step = 3}, std::nullopt,
                             *groups[size_t(r)]);
  });
  REQUIRE_FALSE(first[0]);
  REQUIRE_FALSE(first[1]);

  const auto refused = testing::run_ranks(2, [&](int r) {
    open_training_run(dir, kQuiet, {}, *groups[size_t(r)]);
  });
  CHECK_THAT(testing::message_of(refused[0]), Contains("already holds checkpoints of another run"));
  CHECK_THAT(testing::message_of(refused[1]), Contains("rank 1: rank 0 could not start the run"));

  const auto resumed = testing::run_ranks(2, [&](int r) {
    TrainingRun run = open_training_run(dir, kQuiet, {.resume = true}, *groups[size_t(r)]);
    ids[size_t(r)] = run.run_id;
    saved_lr[size_t(r)] = run.saved->changeable.at("lr");
    // One rank alone may not resume a run of two.
    TrainingRun alone = open_training_run(dir, kQuiet, {.resume = true}, testing::one_rank_group());
    errors[size_t(r)] = testing::error_of([&] { record_run_settings(alone, settings("mlp", "0.05")); });
  });
  REQUIRE_FALSE(resumed[0]);
  REQUIRE_FALSE(resumed[1]);
  CHECK(ids[0] == ids[1]);
  CHECK_FALSE(ids[0].empty());
  CHECK(saved_lr == std::vector<std::string>{"0.05", "0.05"});
  CHECK_THAT(errors[0], Contains("world_size: saved 2, now 1") && Contains("ranks"));
  fs::remove_all(dir);
}

TEST_CASE("A resume that changes the learning rate trains with it, schedule included",
          "[optim][checkpoint][run]") {
  TempDir tmp;
  const fs::path dir = tmp.file("lr");
  auto model = models::fashion_mlp(1);
  SGD opt(model->parameters(), {.lr = 0.1});
  StepLR sched(opt, {.step_size = 2, .gamma = 0.5});
  for (int i = 0; i < 3; ++i) sched.step();  // at 0.05
  runtime::CheckpointDir ckpt(dir, kQuiet);
  const auto entry = save_training_checkpoint(
      ckpt, {.model = model.get(), .optimizer = &opt, .scheduler = &sched}, {.step = 3},
      std::nullopt, testing::one_rank_group());

  auto other = models::fashion_mlp(1);
  SGD other_opt(other->parameters(), {.lr = 1.0});
  StepLR other_sched(other_opt, {.step_size = 2, .gamma = 0.5});
  const TrainingParts parts{.model = other.get(), .optimizer = &other_opt, .scheduler = &other_sched};
  load_training_checkpoint(entry.path, parts, testing::one_rank_group(), {.lr = 1.0});
  CHECK(other_sched.base_lrs() == std::vector<double>{1.0});
  CHECK(other_opt.param_groups()[0].options.at("lr") == 0.5);  // 1.0 x 0.5^(3/2)
  other_sched.step();
  CHECK(other_opt.param_groups()[0].options.at("lr") == 0.25);

  load_training_checkpoint(entry.path, parts, testing::one_rank_group());  // without: the saved rate
  CHECK(other_opt.param_groups()[0].options.at("lr") == 0.05);
  fs::remove_all(dir);
}

TEST_CASE("A new learning rate is refused on resume under a schedule that would ignore it",
          "[optim][checkpoint][run]") {
  TempDir tmp;
  const fs::path dir = tmp.file("onecycle-lr");
  auto model = models::fashion_mlp(1);
  SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  OneCycleLR sched(opt, {.max_lr = 0.1, .total_steps = 100});
  for (int i = 0; i < 40; ++i) sched.step();
  runtime::CheckpointDir ckpt(dir, kQuiet);
  const auto entry = save_training_checkpoint(
      ckpt, {.model = model.get(), .optimizer = &opt, .scheduler = &sched}, {.step = 40},
      std::nullopt, testing::one_rank_group());

  // One-cycle's rates come from max_lr: the asked-for 0.01 would be
  // overwritten by the schedule's value at step 40, with no word said.
  auto other = models::fashion_mlp(1);
  SGD other_opt(other->parameters(), {.lr = 0.1, .momentum = 0.9});
  OneCycleLR other_sched(other_opt, {.max_lr = 0.1, .total_steps = 100});
  const double before = other_opt.param_groups()[0].options.at("lr");
  const TrainingParts parts{
      .model = other.get(), .optimizer = &other_opt, .scheduler = &other_sched};
  CHECK_THROWS_WITH(
      load_training_checkpoint(entry.path, parts, testing::one_rank_group(), {.lr = 0.01}),
      Contains("new learning rate (0.01)") && Contains("OneCycleLR") &&
          Contains("resume with the learning rate the run was saved with"));
  CHECK(other_sched.last_epoch() == 0);
  CHECK(other_opt.param_groups()[0].options.at("lr") == before);

  load_training_checkpoint(entry.path, parts, testing::one_rank_group());
  CHECK(other_sched.last_epoch() == 40);
  CHECK(other_opt.param_groups()[0].options.at("lr") == opt.param_groups()[0].options.at("lr"));
  fs::remove_all(dir);
}

TEST_CASE("A subnormal learning rate is saved and restored", "[optim][checkpoint][run]") {
  TempDir tmp;
  auto model = models::fashion_mlp(1);
  SGD opt(model->parameters(), {.lr = 5e-310});
  runtime::CheckpointDir ckpt(tmp.file("tiny"), kQuiet);
  const auto entry = save_training_checkpoint(ckpt, {.model = model.get(), .optimizer = &opt},
                                              {.step = 1, .best_metric = 1e-320}, std::nullopt,
                                              testing::one_rank_group());
  auto other = models::fashion_mlp(2);
  SGD other_opt(other->parameters(), {.lr = 1.0});
  const TrainingProgress progress = load_training_checkpoint(
      entry.path, {.model = other.get(), .optimizer = &other_opt}, testing::one_rank_group());
  CHECK(other_opt.param_groups()[0].options.at("lr") == 5e-310);
  CHECK(progress.best_metric == 1e-320);
}

TEST_CASE("A setting that is not UTF-8 text is recorded whole and checked on resume",
          "[optim][checkpoint][run]") {
  TempDir tmp;
  const fs::path dir = tmp.file("latin1");
  RunSettings latin1 = settings("mlp", "0.05");
  latin1.fixed["data"] = "/tmp/fort\xe9";  // a legal Linux path, not UTF-8
  latin1.changeable["note"] = "a\\b\xff";
  const auto metadata = run_settings_metadata(latin1);
  CHECK(metadata.at("run.fixed_escaped.data") == "/tmp/fort\\xe9");
  CHECK_FALSE(metadata.contains("run.fixed.data"));
  CHECK(read_run_settings(metadata) == latin1);
  CHECK_THAT(testing::error_of([] { run_settings_metadata({.fixed = {{"d\xe9", "x"}}}); }),
             Contains("run setting 'd\\xe9'"));

  saved_run(dir, latin1, {3});  // trains and saves: nothing refuses the path
  TrainingRun same = open_training_run(dir, kQuiet, {.resume = true}, testing::one_rank_group());
  REQUIRE(same.saved);
  CHECK(same.saved->fixed.at("data") == "/tmp/fort\xe9");
  CHECK(record_run_settings(same, latin1).empty());

  TrainingRun other = open_training_run(dir, kQuiet, {.resume = true}, testing::one_rank_group());
  RunSettings utf8 = latin1;
  utf8.fixed["data"] = "/tmp/fort\xc3\xa9";  // the same name in UTF-8: other bytes, another dir
  CHECK_THAT(testing::error_of([&] { record_run_settings(other, utf8); }),
             Contains("data: saved /tmp/fort\\xe9, now /tmp/fort\xc3\xa9"));
  fs::remove_all(dir);
}

TEST_CASE("A restarted job continues the run it was saving, and only that run",
          "[optim][checkpoint][run]") {
  TempDir tmp;
  const fs::path dir = tmp.file("job");
  auto model = models::fashion_mlp(1);
  const auto save = [&](TrainingRun& run, int64_t step) {
    save_training_checkpoint(run.dir, {.model = model.get()}, {.step = step}, std::nullopt,
                             testing::one_rank_group());
  };
  const auto open = [&](const TrainingRunOptions& options) {
    return open_training_run(dir, kQuiet, options, testing::one_rank_group());
  };

  SECTION("a new run's job, restarted after it saved, continues it without --resume") {
    TrainingRun first = open({.job = "job-a"});
    record_run_settings(first, settings("mlp", "0.05"));
    save(first, 5);
    save(first, 10);
    for (const TrainingRunOptions& options :
         {TrainingRunOptions{.job = "job-a"}, TrainingRunOptions{.restart = true, .job = "job-a"},
          TrainingRunOptions{.resume = true, .job = "job-a"}}) {
      TrainingRun again = open(options);
      CHECK(again.continues_job);
      REQUIRE(again.resume_from);
      CHECK(again.resume_from->step == 10);
      CHECK(again.run_id == first.dir.run().id);
      CHECK(again.dir.run().job == "job-a");
      REQUIRE_FALSE(again.notes.empty());
      CHECK_THAT(again.notes[0], Contains("job job-a was saving run " + again.run_id));
      CHECK(again.dir.list().size() == 2);  // a restart moved nothing aside
    }
    // Another job finds another run's files: refused, as for any new run.
    CHECK_THAT(testing::error_of([&] { open({.job = "job-b"}); }),
               Contains("already holds checkpoints of another run"));
    CHECK_FALSE(open({.resume = true, .job = "job-b"}).continues_job);
  }
  SECTION("a job refused at its start is refused again at every restart") {
    TrainingRun other = open({.job = "job-old"});
    save(other, 10);
    for (int attempt = 0; attempt < 2; ++attempt)
      CHECK_THAT(testing::error_of([&] { open({.job = "job-new"}); }),
                 Contains("already holds checkpoints of another run") &&
                     Contains("run " + other.dir.run().id));
    CHECK(other.dir.list().size() == 1);
  }
  SECTION("a --restart that died before moving the files moves them on its next attempt") {
    TrainingRun old = open({.job = "job-old"});
    save(old, 10);
    TrainingRun fresh = open({.restart = true, .job = "job-new"});  // the attempt after one that died early
    CHECK_FALSE(fresh.continues_job);
    CHECK_FALSE(fresh.resume_from);
    REQUIRE(fresh.notes.size() == 1);
    CHECK_THAT(fresh.notes[0], Contains("moved the 1 checkpoint file(s)"));
    // It died again before saving: the next attempt starts the new run again
    // and has nothing to move; once it saved, restarts continue it.
    TrainingRun third = open({.restart = true, .job = "job-new"});
    CHECK(third.notes.empty());
    save(third, 3);
    TrainingRun fourth = open({.restart = true, .job = "job-new"});
    CHECK(fourth.continues_job);
    REQUIRE(fourth.resume_from);
    CHECK(fourth.resume_from->step == 3);
    CHECK(fourth.run_id == third.dir.run().id);
  }
  SECTION("a job that resumed an older run continues that run, from its own newest save") {
    TrainingRun older = open({.job = "job-1"});
    record_run_settings(older, settings("mlp", "0.05"));
    save(older, 5);
    TrainingRun resumed = open({.resume = true, .job = "job-2"});
    CHECK_FALSE(resumed.continues_job);
    record_run_settings(resumed, settings("mlp", "0.05"));
    save(resumed, 8);
    const auto entries = resumed.dir.list();
    REQUIRE(entries.size() == 2);
    CHECK(entries[1].job_id == "job-2");
    CHECK(entries[1].run_id == older.dir.run().id);
    TrainingRun restarted = open({.job = "job-2"});
    CHECK(restarted.continues_job);
    CHECK(restarted.resume_from->step == 8);
    CHECK(restarted.run_id == older.dir.run().id);
  }
  fs::remove_all(dir);
}

TEST_CASE("The data path is compared as a path: another spelling of it resumes",
          "[optim][checkpoint][run][data]") {
  const auto with = [](const std::string& data) {
    return RunSettings{.fixed = {{"model", "mlp"}, {kDataSetting, data}}};
  };
  // A trailing '/' or '.' used to refuse the resume as if the data had changed.
  for (const char* same : {"/srv/data/", "/srv/data/.", "/srv/./data", "/srv/data//"})
    CHECK_NOTHROW(compare_run_settings(with("/srv/data"), with(same), "ckpt"));
  CHECK_NOTHROW(compare_run_settings(with("data/"), with("data"), "ckpt"));
  CHECK_NOTHROW(compare_run_settings(with("./data"), with("data"), "ckpt"));
  CHECK_NOTHROW(compare_run_settings(with("/"), with("/"), "ckpt"));
  // Another directory is still refused, spelled as given.
  CHECK_THAT(testing::error_of([&] {
               compare_run_settings(with("/srv/data/"), with("/srv/other"), "ckpt");
             }),
             Contains("data: saved /srv/data/, now /srv/other"));
  CHECK_THAT(testing::error_of([&] { compare_run_settings(with("data"), with("/data"), "ckpt"); }),
             Contains("data: saved data, now /data"));
}
