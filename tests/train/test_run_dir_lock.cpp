// One run at a time in a checkpoint directory (run_dir_lock.h): another
// process's run is refused while it holds the directory, and the lock goes
// with that process, however it ends.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lockstep/train/run_dir_lock.h"
#include "collectives/rank_threads.h"
#include "lockstep/train/training_run.h"
#include "support/forked_child.h"
#include "support/scoped_umask.h"
#include "support/skip.h"
#include "support/temp_dir.h"
#include "support/test_util.h"

using lockstep::testing::error_of;
using lockstep::testing::TempDir;
using lockstep::train::RunDirLock;
using Catch::Contains;

namespace {

// A child process that takes the lock of `dir`, says so on a pipe, and holds
// it until killed.
pid_t holder_of(const std::filesystem::path& dir) {
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(ready[0]);
    try {
      const RunDirLock held = RunDirLock::acquire(dir);
      const char ok = held.held() ? 'y' : 'n';
      [[maybe_unused]] const ssize_t n = write(ready[1], &ok, 1);
      for (;;) pause();
    } catch (...) {
      _exit(1);
    }
  }
  close(ready[1]);
  char ok = 0;
  REQUIRE(read(ready[0], &ok, 1) == 1);
  close(ready[0]);
  REQUIRE(ok == 'y');
  return pid;
}

}  // namespace

TEST_CASE("A checkpoint directory that another process's run holds is refused, naming it; "
          "its end frees it",
          "[checkpoint][run]") {
  TempDir tmp;
  const std::filesystem::path dir = tmp.file("held");
  std::filesystem::create_directories(dir);
  const pid_t other = holder_of(dir);

  const std::string message = error_of([&] { RunDirLock::acquire(dir); });
  CHECK_THAT(message, Contains(fmt::format("checkpoint directory {} is in use by another run: "
                                           "process {} on ",
                                           dir.string(), other)) &&
                          Contains("Wait for that run to end"));
  // The same through a run: rank 0 refuses before deciding anything.
  const std::string run = error_of([&] {
    lockstep::train::open_training_run(dir, {}, {.resume = true},
                                       lockstep::testing::one_rank_group());
  });
  CHECK_THAT(run, Contains("is in use by another run"));

  // Killed outright: the kernel drops its lock.
  kill(other, SIGKILL);
  waitpid(other, nullptr, 0);
  const RunDirLock mine = RunDirLock::acquire(dir);
  CHECK(mine.held());
  // One process may hold it again (a program opening its run twice).
  CHECK(RunDirLock::acquire(dir).held());
}

TEST_CASE("A run's lock stays held when its process takes it again and lets that go",
          "[checkpoint][run]") {
  // POSIX record locks are the process's: closing any descriptor of the lock
  // file drops them, so a second acquire that ended freed the first run's
  // directory for anyone.
  TempDir tmp;
  const std::filesystem::path dir = tmp.file("twice");
  std::filesystem::create_directories(dir);
  // Whether a child process can take the lock now.
  const auto child_gets_it = [&] {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      try {
        _exit(RunDirLock::acquire(dir).held() ? 0 : 2);
      } catch (...) {
        _exit(1);
      }
    }
    int status = 0;
    waitpid(pid, &status, 0);
    REQUIRE(WIFEXITED(status));
    return WEXITSTATUS(status) == 0;
  };
  RunDirLock mine = RunDirLock::acquire(dir);
  { const RunDirLock again = RunDirLock::acquire(dir); CHECK(again.held()); }
  CHECK_FALSE(child_gets_it());
  RunDirLock moved = std::move(mine);
  mine = RunDirLock::acquire(dir);
  mine = RunDirLock();
  CHECK_FALSE(child_gets_it());
  moved = RunDirLock();
  CHECK(child_gets_it());
}

TEST_CASE("A run refused because another holds the directory leaves that run's files alone",
          "[checkpoint][run]") {
  // The run holding the directory writes a checkpoint from another node (or
  // container): its writer's pid means nothing here, and its temporary file
  // looks left by a dead writer. Removing it would fail that run's save.
  TempDir tmp;
  const std::filesystem::path dir = tmp.file("busy");
  std::filesystem::create_directories(dir);
  const pid_t other = holder_of(dir);
  int64_t max_pid = 4194304;
  std::ifstream("/proc/sys/kernel/pid_max") >> max_pid;
  const std::filesystem::path writing =
      dir / fmt::format(".ckpt-0000000005.safetensors.tmp-{}-0", max_pid + 1);
  std::ofstream(writing) << "being written";
  std::vector<std::string> warnings;
  const std::string run = error_of([&] {
    lockstep::train::open_training_run(
        dir, {.warn = [&](const std::string& w) { warnings.push_back(w); }}, {.resume = true},
        lockstep::testing::one_rank_group());
  });
  CHECK_THAT(run, Contains("is in use by another run"));
  CHECK(std::filesystem::exists(writing));
  CHECK(warnings.empty());
  kill(other, SIGKILL);
  waitpid(other, nullptr, 0);
}

TEST_CASE("run dir lock: the lock file's mode is what the umask leaves of 0666",
          "[checkpoint][run]") {
  // A group sharing a checkpoint directory (umask 002) takes turns at its
  // runs: the lock needs a file they can open for writing. It was 0644.
  TempDir dir;
  {
    const lockstep::testing::ScopedUmask group_shares(002);
    const RunDirLock held = RunDirLock::acquire(dir.str());
  }
  struct stat st {};
  REQUIRE(::stat(dir.file(".lockstep-run.lock").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0664);
}

TEST_CASE("run dir lock: another user's lock that this user cannot open is named with its mode "
          "and owner",
          "[checkpoint][run]") {
  // Made under umask 022 by one user of a group-shared directory: the others
  // were told to pick a directory they can write, which they can.
  LOCKSTEP_SKIP_IF(::geteuid() != 0 ? "needs root, to run as another user" : "");
  TempDir dir;
  REQUIRE(::chmod(dir.str().c_str(), 0777) == 0);
  {
    const lockstep::testing::ScopedUmask old_default(022);
    const RunDirLock held = RunDirLock::acquire(dir.str());
  }
  const std::string message = lockstep::testing::error_in_forked_child([&] {
    LOCKSTEP_CHECK(::setgid(65534) == 0 && ::setuid(65534) == 0, "cannot become nobody");
    LOCKSTEP_CHECK(::access(dir.str().c_str(), W_OK | X_OK) == 0, "unreachable as nobody");
    RunDirLock::acquire(dir.str());
  });
  LOCKSTEP_SKIP_IF(message.find("unreachable as nobody") != std::string::npos
                       ? "the temporary directory is out of another user's reach (TMPDIR)"
                       : "");
  CHECK_THAT(message, Contains("mode 644, owned by uid 0") && Contains("another user's run") &&
                          Contains("chmod g+w"));
}
