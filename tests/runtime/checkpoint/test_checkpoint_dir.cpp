// CheckpointDir: file naming, retention (last K plus the best), state
// recovered from the directory alone, temporary files, corrupt newest files.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "lockstep/runtime/checkpoint/atomic_file.h"
#include "lockstep/runtime/checkpoint/checkpoint_dir.h"
#include "runtime/checkpoint/checkpoint_test_util.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;
namespace fs = std::filesystem;

TEST_CASE("checkpoint dir: keeps the last K", "[checkpoint]") {
  TempDir tmp;
  CheckpointDir dir(tmp.str(), {.keep_last = 2});
  for (int64_t step : {100, 200, 300, 400}) dir.save(small_content(uint32_t(step)), step);
  CHECK(steps(dir) == std::vector<int64_t>{300, 400});
  CHECK(dir.list().back().path.filename() == "ckpt-0000000400.safetensors");
  CHECK_FALSE(dir.best());  // BestMode::none

  auto latest = dir.load_latest();
  REQUIRE(latest);
  CHECK(latest->entry.step == 400);
  CHECK(latest->content.metadata.at(kStepKey) == "400");
  CHECK(same_tensor(latest->content.tensors[0].second, small_content(400).tensors[0].second));
}

TEST_CASE("checkpoint dir: keeps the best as well, by min or max", "[checkpoint]") {
  TempDir tmp;
  SECTION("min") {
    CheckpointDir dir(tmp.str(), {.keep_last = 2, .best = BestMode::min});
    const double losses[] = {0.9, 0.5, 0.7, 0.6, 0.8};
    for (int i = 0; i < 5; ++i) dir.save(small_content(), i, losses[i]);
    CHECK(steps(dir) == std::vector<int64_t>{1, 3, 4});
    REQUIRE(dir.best());
    CHECK(dir.best()->step == 1);
    CHECK(*dir.best()->metric == 0.5);
  }
  SECTION("max, with a NaN that never wins") {
    CheckpointDir dir(tmp.str(), {.keep_last = 1, .best = BestMode::max});
    dir.save(small_content(), 1, 0.70);
    dir.save(small_content(), 2, std::nan(""));
    dir.save(small_content(), 3, 0.65);
    CHECK(steps(dir) == std::vector<int64_t>{1, 3});
    CHECK(dir.best()->step == 1);
    dir.save(small_content(), 4, 0.75);  // a new best: the old one goes
    CHECK(steps(dir) == std::vector<int64_t>{4});
  }
  SECTION("of equal metrics the earliest stays best") {
    CheckpointDir dir(tmp.str(), {.keep_last = 1, .best = BestMode::min});
    dir.save(small_content(), 1, 0.5);
    dir.save(small_content(), 2, 0.5);
    dir.save(small_content(), 3, 0.6);
    CHECK(steps(dir) == std::vector<int64_t>{1, 3});
    CHECK(dir.best()->step == 1);
  }
  SECTION("a NaN first, and only NaNs, are never best") {
    CheckpointDir dir(tmp.str(), {.keep_last = 1, .best = BestMode::min});
    dir.save(small_content(), 1, std::nan(""));
    dir.save(small_content(), 2, std::nan(""));
    CHECK_FALSE(dir.best());
    CHECK(steps(dir) == std::vector<int64_t>{2});
    dir.save(small_content(), 3, 0.4);
    REQUIRE(dir.best());
    CHECK(dir.best()->step == 3);
  }
}

TEST_CASE("checkpoint dir: a new instance recovers the state from the files", "[checkpoint]") {
  TempDir tmp;
  {
    CheckpointDir dir(tmp.str(), {.keep_last = 2, .best = BestMode::min});
    dir.save(small_content(), 10, 0.25);
    dir.save(small_content(), 20, 0.5);
    dir.save(small_content(), 30, 0.75);
  }
  CheckpointDir again(tmp.str(), {.keep_last = 2, .best = BestMode::min});
  CHECK(steps(again) == std::vector<int64_t>{10, 20, 30});
  CHECK(again.best()->step == 10);
  CHECK(again.best()->metric == 0.25);
  CHECK(again.latest()->step == 30);
  // Continuing the run that saved them: retention goes on over its files.
  REQUIRE(again.latest()->run_id);
  again.set_run({.id = *again.latest()->run_id});
  again.save(small_content(), 40, 0.9);
  CHECK(steps(again) == std::vector<int64_t>{10, 30, 40});
}

TEST_CASE("checkpoint dir: other files and temporary files are ignored", "[checkpoint]") {
  TempDir tmp;
  CheckpointDir dir(tmp.str());
  dir.save(small_content(), 5);
  std::ofstream(tmp.file("notes.txt")) << "x";
  std::ofstream(tmp.file("ckpt-abc.safetensors")) << "x";
  std::ofstream(tmp.file(".ckpt-0000000006.safetensors.tmp-" + std::to_string(::getpid()) + "-0"))
      << "partial";
  CHECK(steps(dir) == std::vector<int64_t>{5});
  CHECK(dir.latest()->step == 5);
}

TEST_CASE("checkpoint dir: stale temporary files of dead writers are removed", "[checkpoint]") {
  TempDir tmp;
  // A pid that no process has: the first pid past the maximum is never used.
  int64_t max_pid = 4194304;
  std::ifstream("/proc/sys/kernel/pid_max") >> max_pid;
  const std::string stale =
      tmp.file(".ckpt-0000000007.safetensors.tmp-" + std::to_string(max_pid + 1) + "-0");
  std::ofstream(stale) << "partial";
  std::vector<std::string> warnings;
  CheckpointDir dir(tmp.str(), {.warn = [&](const std::string& w) { warnings.push_back(w); }});
  CHECK_FALSE(fs::exists(stale));
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Contains("did not finish"));
}

TEST_CASE("checkpoint dir: a zombie writer's temporary file is removed by the next save",
          "[checkpoint]") {
  TempDir tmp;
  std::vector<std::string> warnings;
  CheckpointDir dir(tmp.str(), {.warn = [&](const std::string& w) { warnings.push_back(w); }});
  // A writer that exited without finishing and that its parent has not
  // reaped yet: its pid still answers kill(pid, 0), but it writes no more.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const std::string name = tmp.file(".ckpt-0000000009.safetensors.tmp-" +
                                      std::to_string(::getpid()) + "-0");
    const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    ::_exit(fd >= 0 && ::write(fd, "partial", 7) == 7 ? 0 : 1);
  }
  const std::string temp =
      tmp.file(".ckpt-0000000009.safetensors.tmp-" + std::to_string(child) + "-0");
  auto state = [&] {
    std::ifstream stat("/proc/" + std::to_string(child) + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t paren = line.rfind(')');
    return paren == std::string::npos || paren + 2 >= line.size() ? '?' : line[paren + 2];
  };
  for (int i = 0; i < 6000 && state() != 'Z'; ++i) ::usleep(10000);
  REQUIRE(state() == 'Z');
  REQUIRE(fs::exists(temp));

  dir.save(small_content(), 10);
  CHECK_FALSE(fs::exists(temp));
  CHECK(steps(dir) == std::vector<int64_t>{10});
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Contains(temp) && Contains("did not finish"));
  int status = 0;
  CHECK(::waitpid(child, &status, 0) == child);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
}

TEST_CASE("checkpoint dir: a corrupt newest checkpoint is skipped or reported", "[checkpoint]") {
  TempDir tmp;
  std::vector<std::string> warnings;
  CheckpointDirOptions options{.keep_last = 3,
                               .warn = [&](const std::string& w) { warnings.push_back(w); }};
  CheckpointDir dir(tmp.str(), options);
  dir.save(small_content(1), 1);
  dir.save(small_content(2), 2);
  const std::string newest = dir.path_for_step(2).string();
  flip_bit(newest, data_offset_of(newest) + 3);

  SECTION("skipped with a warning naming it") {
    auto latest = dir.load_latest();
    REQUIRE(latest);
    CHECK(latest->entry.step == 1);
    REQUIRE(warnings.size() == 1);
    CHECK_THAT(warnings[0], Contains(newest) && Contains("fails its checksum"));
    CHECK(dir.latest()->step == 1);
  }
  SECTION("reported as an error") {
    options.on_corrupt = OnCorrupt::throw_error;
    CheckpointDir strict(tmp.str(), options);
    CHECK_THAT(error_of([&] { strict.latest(); }),
               Contains(newest) && Contains("fails its checksum"));
  }
  SECTION("none loads") {
    const std::string older = dir.path_for_step(1).string();
    fs::resize_file(older, 3);
    CHECK_FALSE(dir.latest());
    CHECK(warnings.size() == 2);
  }
}

TEST_CASE("checkpoint dir: a reader whose listed files a running job deletes takes the newer one",
          "[checkpoint]") {
  // An evaluator reads the directory while the job saves into it: between
  // the reader's listing and its opening a file, the job saves step 4 and its
  // retention deletes steps 1 to 3. Those files are gone, not corrupt, and
  // step 4 is there; before, the reader tried each listed file in turn and
  // answered that no checkpoint loads.
  TempDir tmp;
  CheckpointDir job(tmp.str(), {.keep_last = 3});
  for (int64_t step : {1, 2, 3}) job.save(small_content(uint32_t(step)), step);
  const std::string damaged = job.path_for_step(3).string();
  flip_bit(damaged, data_offset_of(damaged) + 3);
  std::vector<std::string> warnings;
  CheckpointDir reader(tmp.str(), {.warn = [&](const std::string& w) {
                                     warnings.push_back(w);
                                     if (warnings.size() > 1) return;
                                     job.set_keep_last(1);  // the job saves on meanwhile
                                     job.save(small_content(4), 4);
                                   },
                                   .read_only = true});
  const auto latest = reader.load_latest();
  REQUIRE(latest);
  CHECK(latest->entry.step == 4);
  CHECK(same_tensor(latest->content.tensors[0].second, small_content(4).tensors[0].second));
  REQUIRE(warnings.size() == 1);  // the damaged step 3, once
  CHECK_THAT(warnings[0], Contains(damaged) && Contains("fails its checksum"));
  CHECK(steps(job) == std::vector<int64_t>{4});
}

TEST_CASE("checkpoint dir: a save that runs out of room says so, what to do, and keeps the rest",
          "[checkpoint]") {
  TempDir tmp;
  CheckpointDir dir(tmp.str(), {.keep_last = 2});
  dir.save(small_content(1), 1);
  dir.save(small_content(2), 2);
  CheckpointContent big;
  big.tensors.emplace_back("w", Tensor::zeros({64 * 1024}));
  std::string message;
  {
    // Files limited to 16 KiB, the signal ignored: write fails with EFBIG, as
    // a full disk fails it with ENOSPC.
    rlimit before{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &before) == 0);
    const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
    rlimit limited = before;
    limited.rlim_cur = 16 * 1024;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &limited) == 0);
    try {
      dir.save(big, 3);
    } catch (const lockstep::Error& e) {
      message = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &before);
    ::signal(SIGXFSZ, old_handler);
  }
  CHECK_THAT(message, Contains("saving step 3 failed, and the checkpoints there are as they "
                               "were") &&
                          Contains("File too large") && Contains("keep_last 2") &&
                          Contains("free space there, keep fewer, or save elsewhere"));
  CHECK(steps(dir) == std::vector<int64_t>{1, 2});
  for (const auto& f : fs::directory_iterator(tmp.str()))
    CHECK_FALSE(is_temp_file_name(f.path().filename().string()));
  REQUIRE(dir.load_latest());
  CHECK(dir.load_latest()->entry.step == 2);
}

TEST_CASE("checkpoint dir: a path through a symbolic link to nothing is named as such",
          "[checkpoint]") {
  // A checkpoint directory on a volume that is not mounted, reached through
  // a link: the system's reason for the failed mkdir is "File exists", which
  // is not what is wrong.
  TempDir tmp;
  const fs::path link = tmp.file("volume");
  fs::create_symlink("not-mounted/ckpts", link);
  for (const fs::path& dir : {link, link / "run" / "ckpt"}) {
    const std::string message = error_of([&] { CheckpointDir d(dir); });
    CHECK_THAT(message, Contains(link.string() + " is a symbolic link to " +
                                 tmp.file("not-mounted/ckpts") + ", which does not exist") &&
                            Contains("not mounted") && !Contains("File exists"));
  }
  CHECK_FALSE(fs::exists(tmp.file("not-mounted")));
}

TEST_CASE("checkpoint dir: refuses bad options", "[checkpoint]") {
  TempDir tmp;
  CHECK_THAT(error_of([&] { CheckpointDir(tmp.str(), {.keep_last = 0}); }),
             Contains("keep_last is 0"));
  CHECK_THAT(error_of([&] { CheckpointDir(tmp.str()).save(small_content(), -1); }),
             Contains("step -1 is negative"));
}
