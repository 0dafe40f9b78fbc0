// CheckpointDir and runs: retention only ever deletes files of the run that
// saves, never its newest save; other runs' files and damaged files stay.
// A directory that cannot be written fails when it is opened.
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
