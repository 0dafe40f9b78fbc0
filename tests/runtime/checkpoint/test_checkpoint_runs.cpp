// CheckpointDir and runs: retention only ever deletes files of the run that
// saves, never its newest save; other runs' files and damaged files stay,
// and no save replaces them. A directory that cannot be written fails when
// it is opened. Metrics and jobs read back from the files.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "lockstep/runtime/checkpoint/checkpoint_dir.h"
#include "runtime/checkpoint/checkpoint_test_util.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

CheckpointDirOptions quiet(int keep_last, BestMode best = BestMode::none) {
  return {.keep_last = keep_last, .best = best, .warn = [](const std::string&) {}};
}

}  // namespace

TEST_CASE("checkpoint runs: a new run keeps its saves beside an older, longer run's",
          "[checkpoint]") {
  TempDir tmp;
  {
    CheckpointDir older(tmp.str(), quiet(2, BestMode::max));
    for (int64_t step : {100, 200, 300}) older.save(small_content(), step, 0.5);
  }
  CHECK(steps(CheckpointDir(tmp.str())) == std::vector<int64_t>{100, 200, 300});

  CheckpointDir newer(tmp.str(), quiet(2, BestMode::max));
  for (int64_t step : {10, 20, 30}) newer.save(small_content(), step, 0.1 * double(step));
  // The new run's last two (30 its best too); all of the older run's (which
  // kept its best, 100, and its last two).
  CHECK(steps(newer) == std::vector<int64_t>{20, 30, 100, 200, 300});
}

TEST_CASE("checkpoint runs: damaged files with higher steps cost a run none of its saves",
          "[checkpoint]") {
  TempDir tmp;
  std::ofstream(tmp.file("ckpt-0000009999.safetensors")) << "not a checkpoint";
  CheckpointDir dir(tmp.str(), quiet(2));
  for (int64_t step : {1, 2, 3}) dir.save(small_content(), step);
  CHECK(steps(dir) == std::vector<int64_t>{2, 3, 9999});
  CHECK(fs::exists(dir.path_for_step(9999)));
}

TEST_CASE("checkpoint runs: the newest save survives its run's own files of higher steps",
          "[checkpoint]") {
  // As after a resume from step 500 when step 600 of the same run did not
  // load: the run goes on from 500 and its new saves must stay.
  TempDir tmp;
  CheckpointDir dir(tmp.str(), quiet(1));
  dir.save(small_content(), 500);
  dir.save(small_content(), 600);
  dir.save(small_content(), 510);
  dir.save(small_content(), 520);
  // 510 and 500 went (keep_last 1 within the run up to its newest save);
  // 600, beyond where the run now is, is not retention's to judge.
  CHECK(steps(dir) == std::vector<int64_t>{520, 600});
}

TEST_CASE("checkpoint runs: a directory that cannot be written fails when opened", "[checkpoint]") {
  TempDir tmp;
  SECTION("it cannot be created") {
    std::ofstream(tmp.file("file")) << "a file, not a directory";
    CHECK_THAT(error_of([&] { CheckpointDir(tmp.file("file") + "/ckpt"); }),
               Contains(tmp.file("file") + "/ckpt") && Contains("cannot"));
  }
  SECTION("it exists but takes no files") {
    std::string dir = tmp.file("read-only");
    if (::geteuid() != 0) {
      fs::create_directories(dir);
      fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec);
    } else {
      dir = "/sys/kernel";  // root ignores permission bits; sysfs refuses new files
    }
    const std::string probe = dir + "/.lockstep-write-probe";
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) {
      ::close(fd);
      ::unlink(probe.c_str());
      WARN("SKIPPED: no directory here refuses new files to this user");
      return;
    }
    CHECK_THAT(error_of([&] { CheckpointDir{dir}; }), Contains(dir) && Contains("cannot"));
    std::error_code ec;  // TempDir must be able to remove it
    fs::permissions(tmp.file("read-only"), fs::perms::owner_all, ec);
  }
}

TEST_CASE("checkpoint dir: a subnormal metric reads back and keeps its file as the best",
          "[checkpoint]") {
  TempDir tmp;
  CheckpointDir dir(tmp.str(), quiet(1, BestMode::min));
  dir.save(small_content(), 1, 1e-310);
  dir.save(small_content(), 2, 0.5);
  dir.save(small_content(), 3, 0.7);
  CHECK(steps(dir) == std::vector<int64_t>{1, 3});
  REQUIRE(dir.best());
  CHECK(dir.best()->step == 1);
  CHECK(dir.best()->metric == 1e-310);
  CHECK(dir.list().front().metric == 1e-310);
}

TEST_CASE("checkpoint dir: a save never replaces another run's file of the same step",
          "[checkpoint]") {
  TempDir tmp;
  std::string older_id;
  {
    CheckpointDir older(tmp.str(), quiet(2, BestMode::max));
    for (int64_t step : {100, 200, 300}) older.save(small_content(), step, step == 100 ? 0.9 : 0.5);
    older_id = older.run().id;
  }
  const std::string best_bytes = read_bytes(CheckpointDir(tmp.str()).path_for_step(100).string());

  CheckpointDir newer(tmp.str(), quiet(2, BestMode::max));
  newer.save(small_content(2), 50, 0.1);
  const std::string message = error_of([&] { newer.save(small_content(2), 100, 0.1); });
  CHECK_THAT(message, Contains("not saving step 100") &&
                          Contains(newer.path_for_step(100).string()) &&
                          Contains("another run, " + older_id) && Contains("Nothing was written"));
  // The older run's best is untouched, and so is the newer run's own file.
  CHECK(read_bytes(newer.path_for_step(100).string()) == best_bytes);
  CHECK(steps(newer) == std::vector<int64_t>{50, 100, 200, 300});

  // Its own file of a step is the run's to replace (a resume from an earlier step).
  const auto again = newer.save(small_content(3), 50, 0.2);
  CHECK(again.run_id == newer.run().id);
  CHECK(newer.list().front().metric == 0.2);

  SECTION("a file without a run id, or whose header does not read, stays too") {
    CheckpointContent legacy = load_checkpoint(newer.path_for_step(50));
    legacy.metadata.erase(kRunKey);
    save_checkpoint(newer.path_for_step(60), legacy);
    CHECK_THAT(error_of([&] { newer.save(small_content(), 60); }),
               Contains("saved without a run id"));
    std::ofstream(newer.path_for_step(70)) << "damaged";
    CHECK_THAT(error_of([&] { newer.save(small_content(), 70); }),
               Contains("header does not read"));
    CHECK(read_bytes(newer.path_for_step(70).string()) == "damaged");
  }
}

TEST_CASE("checkpoint dir: the job that saved a checkpoint rides in it", "[checkpoint]") {
  TempDir tmp;
  CheckpointDir dir(tmp.str(), quiet(2));
  dir.set_run({.job = "job-1"});
  dir.save(small_content(), 1);
  CheckpointDir plain(tmp.str(), quiet(2));
  plain.save(small_content(), 2);
  const auto entries = dir.list();
  REQUIRE(entries.size() == 2);
  CHECK(entries[0].job_id == "job-1");
  CHECK_FALSE(entries[1].job_id);

  // Metadata a run records must be text a header can hold, under its own keys.
  CHECK_THAT(error_of([&] { dir.set_run({.metadata = {{"data", "/tmp/fort\xe9"}}}); }),
             Contains("run metadata 'data'") && Contains("/tmp/fort\\xe9") &&
                 Contains("escape_bytes"));
  CHECK_THAT(error_of([&] { dir.set_run({.metadata = {{"lockstep.step", "1"}}}); }),
             Contains("the directory's own"));
}

TEST_CASE("checkpoint runs: a copy the user named like a checkpoint is never deleted or moved",
          "[checkpoint]") {
  // The directory writes "ckpt-<step, 10 digits>.safetensors" only; a copy
  // such as "ckpt-300.safetensors" (the same run's bytes) is the user's.
  TempDir tmp;
  CheckpointDir dir(tmp.str(), quiet(1, BestMode::max));
  dir.save(small_content(), 300, 0.5);
  const std::vector<std::string> copies = {"ckpt-300.safetensors", "ckpt-00000000300.safetensors",
                                           "ckpt-0300.safetensors"};
  for (const auto& name : copies) fs::copy_file(dir.path_for_step(300), tmp.file(name));
  for (int64_t step : {400, 500}) dir.save(small_content(), step, 0.002 * double(step));
  CHECK(steps(dir) == std::vector<int64_t>{500});
  for (const auto& name : copies) CHECK(fs::exists(tmp.file(name)));
  CHECK(dir.set_aside().filename().string().starts_with("ckpt-set-aside-"));
  for (const auto& name : copies) CHECK(fs::exists(tmp.file(name)));
  CHECK(steps(dir).empty());
}
