// write_file_atomically and check_can_write_file on paths that cannot take a
// file: refused up front with a message that says why, nothing left behind.
// Stale temporary files: a killed writer's is removed, even one that had this
// process's pid; one being written is not.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "lockstep/runtime/checkpoint/atomic_file.h"
#include "lockstep/runtime/error.h"
#include "support/scoped_umask.h"
#include "support/temp_dir.h"

using lockstep::runtime::check_can_write_file;
using lockstep::runtime::remove_stale_temp_files;
using lockstep::runtime::write_file_atomically;
using lockstep::testing::TempDir;
namespace fs = std::filesystem;

namespace {

void write_text(const fs::path& path, const std::string& text) {
  write_file_atomically(path, [&](int fd, const std::string&) {
    REQUIRE(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  });
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("atomic file: a path naming a directory is refused before anything is written",
          "[checkpoint]") {
  TempDir dir;
  const fs::path sub = fs::path(dir.str()) / "runs";
  fs::create_directories(sub);
  for (const fs::path& path : {sub, fs::path(sub.string() + "/"), fs::path(dir.str() + "/new/")}) {
    INFO(path.string());
    CHECK_THROWS_WITH(check_can_write_file(path), Catch::Contains("it names a directory") &&
                                                      Catch::Contains("give the path of a file"));
    CHECK_THROWS_WITH(write_text(path, "x"), Catch::Contains("it names a directory"));
  }
  CHECK(fs::is_empty(sub));  // no temporary file left behind
  CHECK(!fs::exists(fs::path(dir.str()) / "new"));
}

TEST_CASE("atomic file: a missing directory is named; a good path is written and replaced",
          "[checkpoint]") {
  TempDir dir;
  const fs::path missing = fs::path(dir.str()) / "absent" / "log.json";
  CHECK_THROWS_WITH(check_can_write_file(missing),
                    Catch::Contains("cannot create files in") && Catch::Contains("absent"));
  const fs::path file = dir.file("log.json");
  check_can_write_file(file);
  write_text(file, "first");
  write_text(file, "second");
  CHECK(read_text(file) == "second");
  CHECK(std::distance(fs::directory_iterator(dir.str()), fs::directory_iterator()) == 1);
}

TEST_CASE("atomic file: a killed writer's temporary file with this process's pid is removed",
          "[checkpoint]") {
  // A restarted container (or pod) numbers its processes alike, so the rank
  // that saves often gets the pid its killed predecessor wrote with: that
  // partial file is no write of this process and must go, while one this
  // process is writing stays.
  TempDir dir;
  const std::string pid = std::to_string(::getpid());
  const fs::path left = dir.file(".ckpt-0000000007.safetensors.tmp-" + pid + "-0");
  std::ofstream(left) << "partial, from the process that had this pid before";
  std::vector<fs::path> removed_while_writing;
  write_file_atomically(dir.file("ckpt-0000000008.safetensors"), [&](int fd, const std::string&) {
    removed_while_writing = remove_stale_temp_files(dir.str());
    REQUIRE(::write(fd, "x", 1) == 1);
  });
  CHECK(removed_while_writing == std::vector<fs::path>{left});
  CHECK_FALSE(fs::exists(left));
  CHECK(read_text(dir.file("ckpt-0000000008.safetensors")) == "x");
  CHECK(std::distance(fs::directory_iterator(dir.str()), fs::directory_iterator()) == 1);
}

TEST_CASE("atomic file: writing a file removes the partial copies its killed writers left, "
          "and no other file's",
          "[checkpoint]") {
  // A program that saves model.safetensors itself (not through CheckpointDir,
  // which sweeps its directory) and is killed mid-save at each restart: before,
  // every kill left a partial copy as large as the model, never removed.
  TempDir dir;
  int64_t max_pid = 4194304;
  std::ifstream("/proc/sys/kernel/pid_max") >> max_pid;
  const std::string gone = std::to_string(max_pid + 1);
  std::vector<fs::path> left;
  for (int kill = 0; kill < 3; ++kill) {
    left.push_back(dir.file(".model.safetensors.tmp-" + gone + "-" + std::to_string(kill)));
    std::ofstream(left.back()) << "partial";
  }
  const fs::path other = dir.file(".log.json.tmp-" + gone + "-0");
  std::ofstream(other) << "partial";
  write_text(dir.file("model.safetensors"), "whole");
  for (const fs::path& p : left) CHECK_FALSE(fs::exists(p));
  CHECK(fs::exists(other));  // another file's: left to that file's next write
  CHECK(read_text(dir.file("model.safetensors")) == "whole");
  write_text(dir.file("log.json"), "{}");
  CHECK_FALSE(fs::exists(other));
}

TEST_CASE("atomic file: a temporary file whose writer's pid is not visible here stays while "
          "it is written",
          "[checkpoint]") {
  // An evaluator in another container (its own pid namespace) or on another
  // node opens the job's checkpoint directory while the job writes: the pid
  // in the temporary file's name is no process it can see. Before, it removed
  // the file as stale, and the job's save failed at its rename. Here the
  // writer's file is renamed to carry a pid that no process has, which is
  // what such a reader sees, and renamed back before the writer goes on.
  TempDir dir;
  int64_t max_pid = 4194304;
  std::ifstream("/proc/sys/kernel/pid_max") >> max_pid;
  const fs::path unseen =
      dir.file(".ckpt-0000000005.safetensors.tmp-" + std::to_string(max_pid + 1) + "-0");
  std::vector<fs::path> removed;
  write_file_atomically(dir.file("ckpt-0000000005.safetensors"),
                        [&](int fd, const std::string& temp) {
                          REQUIRE(::write(fd, "whole", 5) == 5);
                          fs::rename(temp, unseen);
                          removed = remove_stale_temp_files(dir.str());
                          std::error_code ec;
                          fs::rename(unseen, temp, ec);
                        });
  CHECK(removed.empty());
  CHECK(read_text(dir.file("ckpt-0000000005.safetensors")) == "whole");
  // Once its writer is done, such a file is stale again: one left so is removed.
  std::ofstream(unseen) << "partial";
  CHECK(remove_stale_temp_files(dir.str()) == std::vector<fs::path>{unseen});
}

TEST_CASE("atomic file: a temporary file with this process's pid that another namespace's "
          "writer holds locked stays",
          "[checkpoint]") {
  // Two containers each run their program as pid 1 (or any same pid): an
  // evaluator's pid is then the pid in the job's temporary file's name. It
  // is no file of the evaluator's own, and it was removed as an earlier
  // process's without a look at the writer's lock. The file here is held
  // locked as write_file_atomically holds its own.
  TempDir dir;
  const fs::path theirs =
      dir.file(".ckpt-0000000006.safetensors.tmp-" + std::to_string(::getpid()) + "-77");
  std::ofstream(theirs) << "partial";
  {
    const int fd = ::open(theirs.c_str(), O_WRONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    struct flock lock {};
    lock.l_type = F_WRLCK;
    lock.l_whence = SEEK_SET;
    REQUIRE(::fcntl(fd, F_OFD_SETLK, &lock) == 0);
    CHECK(remove_stale_temp_files(dir.str()).empty());
    CHECK(fs::exists(theirs));
    ::close(fd);
  }
  // Its writer gone, the lock with it: stale.
  CHECK(remove_stale_temp_files(dir.str()) == std::vector<fs::path>{theirs});
}

TEST_CASE("atomic file: the file's mode is what the umask leaves of 0666, as a plain open gives",
          "[checkpoint]") {
  // A checkpoint directory shared by a group (umask 002) needs group-writable
  // files, as torch.save's are; they were 0644 whatever the umask.
  // 002 tells the old 0644 from 0666 less the umask; 022 and 077 show the
  // umask is still applied.
  const mode_t mask = GENERATE(mode_t{022}, mode_t{002}, mode_t{077});
  INFO("umask " << std::oct << mask);
  TempDir dir;
  const lockstep::testing::ScopedUmask umask_for_this_test(mask);
  write_text(dir.file("shared.bin"), "x");
  struct stat st {};
  REQUIRE(::stat(dir.file("shared.bin").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == (0666 & ~mask));
}
