// collectives::spawn: real child processes, a real store and group; each
// child reports through a file the parent reads.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <pty.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "lockstep/collectives/init.h"
#include "lockstep/collectives/spawn.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/runtime/threads.h"
#include "nn/ddp/ddp_fixture.h"
#include "support/forked_child.h"
#include "support/open_file_limit.h"
#include "support/subprocess.h"
#include "support/test_util.h"

namespace fs = std::filesystem;
namespace lt = lockstep::testing;
using lockstep::collectives::spawn;
using lockstep::collectives::SpawnError;
using lockstep::collectives::SpawnOptions;
using lockstep::runtime::Tensor;

namespace {

// A fresh directory the children write to, removed at the end.
struct ScratchDir {
  ScratchDir() : path(fs::temp_directory_path() / fmt::format("lockstep-spawn-{}", ::getpid())) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchDir() { fs::remove_all(path); }
  fs::path file(int rank) const { return path / fmt::format("rank{}", rank); }
  fs::path path;
};

void write_text(const fs::path& file, const std::string& text) {
  std::ofstream(file) << text;
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs spawn and returns the SpawnError it throws (none: a failed CHECK).
SpawnError spawn_error(int nprocs, const std::function<void(int)>& fn,
                       const SpawnOptions& options = {}) {
  try {
    spawn(nprocs, fn, options);
  } catch (const SpawnError& e) {
    return e;
  }
  FAIL("spawn returned without an error");
  return SpawnError("", -2, -2);
}

// Sets an environment variable of this process for a scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, const std::string& value) : name_(std::move(name)) {
    if (const char* before = std::getenv(name_.c_str())) before_ = before;
    ::setenv(name_.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (before_) {
      ::setenv(name_.c_str(), before_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> before_;
};

void sleep_long() { std::this_thread::sleep_for(std::chrono::minutes(10)); }

}  // namespace

TEST_CASE("spawn runs fn(rank) in N processes that form a group over the store it serves, "
          "on every CPU backend built in",
          "[spawn]") {
  for (const std::string backend : {"shm", "gloo", "shm+gloo"}) {
    INFO("backend " << backend);
    if (const std::string why = lt::backend_skip_reason(backend); !why.empty()) {
      WARN("not run over " << backend << ": " << why);
      continue;
    }
    ScratchDir dir;
    SpawnOptions options;
    options.env = {{"LOCKSTEP_BACKEND", backend}};
    spawn(
        3,
        [&](int rank) {
          auto group = lockstep::collectives::init_process_group();
          Tensor t = Tensor::from_vector(std::vector<float>{float(rank + 1), float(10 * rank)}, {2});
          group->allreduce(t)->wait();
          const auto v = t.to_vector<double>();
          write_text(dir.file(rank), fmt::format("{} {} {} {} {} {} {}", std::getenv("LOCKSTEP_RANK"),
                                                 group->rank(), group->size(), group->backend(),
                                                 ::getppid(), v[0], v[1]));
        },
        options);
    for (int r = 0; r < 3; ++r) {
      INFO("rank " << r);
      CHECK(read_text(dir.file(r)) == fmt::format("{} {} 3 {} {} 6 30", r, r, backend, ::getpid()));
    }
  }
}

TEST_CASE("spawn: a child that throws stops the others; the error names its rank and message",
          "[spawn]") {
  ScratchDir dir;
  const SpawnError e = spawn_error(3, [&](int rank) {
    if (rank == 1) throw lockstep::Error("bad shard on rank 1");
    sleep_long();
    write_text(dir.file(rank), "ran to the end");
  });
  CHECK(e.rank() == 1);
  CHECK(e.exit_code() == 1);
  CHECK_THAT(e.what(), Catch::StartsWith("spawn: rank 1 of 3 (pid ") &&
                           Catch::Contains("threw: bad shard on rank 1") &&
                           Catch::EndsWith("; stopped the other 2 ranks"));
  CHECK_FALSE(fs::exists(dir.file(0)));
  CHECK_FALSE(fs::exists(dir.file(2)));
}

TEST_CASE("spawn: a child killed by a signal or exiting non-zero is named with how it ended",
          "[spawn]") {
  const SpawnError killed = spawn_error(2, [](int rank) {
    if (rank == 0) ::raise(SIGKILL);
    sleep_long();
  });
  CHECK(killed.rank() == 0);
  CHECK(killed.exit_code() == 128 + SIGKILL);
  CHECK_THAT(killed.what(), Catch::Contains("rank 0 of 2") &&
                                Catch::Contains("was killed by SIGKILL; stopped the other rank"));

  const SpawnError exited = spawn_error(2, [](int rank) {
    if (rank == 1) ::_exit(3);
  });
  CHECK(exited.rank() == 1);
  CHECK(exited.exit_code() == 3);
  CHECK_THAT(exited.what(), Catch::Contains("rank 1 of 2") && Catch::Contains("exited with code 3"));
}

TEST_CASE("spawn: a caller that ignores SIGCHLD still learns how each child ended", "[spawn]") {
  // The kernel reaped ignored children itself, and spawn took the lost status
  // for success: a rank that exited 5 passed.
  struct Ignored {
    struct sigaction before {};
    Ignored() {
      struct sigaction ignore {};
      ignore.sa_handler = SIG_IGN;
      sigemptyset(&ignore.sa_mask);
      ::sigaction(SIGCHLD, &ignore, &before);
    }
    ~Ignored() { ::sigaction(SIGCHLD, &before, nullptr); }
  } ignored;
  const SpawnError exited = spawn_error(2, [](int rank) {
    if (rank == 1) ::_exit(5);
  });
  struct sigaction after {};
  ::sigaction(SIGCHLD, nullptr, &after);
  CHECK(exited.rank() == 1);
  CHECK(exited.exit_code() == 5);
  CHECK(after.sa_handler == SIG_IGN);  // the caller's disposition is back
}

TEST_CASE("spawn: a child that returns before joining the group is named by the others within "
          "seconds",
          "[spawn]") {
  const auto start = std::chrono::steady_clock::now();
  const SpawnError e = spawn_error(2, [](int rank) {
    if (rank == 1) return;
    lockstep::collectives::init_process_group();
  });
  CHECK(e.rank() == 0);
  CHECK_THAT(e.what(), Catch::Contains("but rank 1 exited with code 0 without joining the group"));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
}

TEST_CASE("spawn: in a program that lockstep-run restarted, the children are a job of their "
          "own and a child that returns early is still named",
          "[spawn]") {
  // As in a rank of `lockstep-run --max-restarts` on its second attempt.
  ScopedEnv restart("LOCKSTEP_RESTART_COUNT", "2");
  ScopedEnv job("LOCKSTEP_JOB_ID", "outer-job");
  ScratchDir dir;
  SpawnOptions options;
  options.env = {{"LOCKSTEP_TIMEOUT_S", "60"}};  // not the default's minutes, if it waits
  const SpawnError e = spawn_error(
      2,
      [&](int rank) {
        const char* restart_count = std::getenv("LOCKSTEP_RESTART_COUNT");
        const char* job_id = std::getenv("LOCKSTEP_JOB_ID");
        write_text(dir.file(rank), fmt::format("{} {}", restart_count ? restart_count : "unset",
                                               job_id ? job_id : "unset"));
        if (rank == 1) return;
        lockstep::collectives::init_process_group();
      },
      options);
  CHECK(read_text(dir.file(0)) == "unset unset");
  CHECK(read_text(dir.file(1)) == "unset unset");
  CHECK(e.rank() == 0);
  CHECK_THAT(e.what(), Catch::Contains("but rank 1 exited with code 0 without joining the group"));
}

TEST_CASE("spawn: in a rank that lockstep-run watches for hangs, the children send the "
          "launcher no heartbeat of their own",
          "[spawn]") {
  // As in a rank of `lockstep-run --hang-timeout S` that has not joined a
  // group: its launcher's heartbeat socket is LOCKSTEP_HEARTBEAT_FD. Children
  // that beat on it would make the launcher watch the rank, and call it hung
  // once they end while the rank goes on without beating.
  int beats[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, beats) == 0);
  {
    ScopedEnv fd("LOCKSTEP_HEARTBEAT_FD", std::to_string(beats[1]));
    ScopedEnv ms("LOCKSTEP_HEARTBEAT_MS", "50");
    // The child's end stays open in the children (spawn forks; no exec).
    ::fcntl(beats[1], F_SETFD, 0);
    ScratchDir dir;
    spawn(2, [&](int rank) {
      const char* fd_var = std::getenv("LOCKSTEP_HEARTBEAT_FD");
      write_text(dir.file(rank), fd_var ? fd_var : "unset");
      auto group = lockstep::collectives::init_process_group();
      Tensor t = Tensor::full({4}, 1.0);
      group->allreduce(t)->wait();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // beats, if any, sent
    });
    CHECK(read_text(dir.file(0)) == "unset");
    CHECK(read_text(dir.file(1)) == "unset");
  }
  char beat = 0;
  CHECK(::recv(beats[0], &beat, 1, MSG_DONTWAIT) < 0);  // no beat came
  ::close(beats[0]);
  ::close(beats[1]);
}

TEST_CASE("spawn: children still running at the timeout are stopped and named, SIGKILL for one "
          "that ignores SIGTERM",
          "[spawn]") {
  SpawnOptions options;
  options.timeout = std::chrono::milliseconds(1500);
  options.grace_period = std::chrono::milliseconds(300);
  const SpawnError e = spawn_error(
      3,
      [](int rank) {
        if (rank == 0) return;
        if (rank == 2) ::signal(SIGTERM, SIG_IGN);
        sleep_long();
      },
      options);
  CHECK(e.rank() == 1);
  CHECK(e.exit_code() == -1);
  CHECK_THAT(e.what(), Catch::StartsWith("spawn: ranks 1 and 2 of 3 still running after the "
                                         "timeout of 1.5 s"));
}

TEST_CASE("spawn: options.env reaches every child; OMP_NUM_THREADS is 1 unless set", "[spawn]") {
  ScratchDir dir;
  SpawnOptions options;
  options.env = {{"LOCKSTEP_SPAWN_TEST", "yes"}};
  spawn(
      2,
      [&](int rank) {
        write_text(dir.file(rank), fmt::format("{} {}", std::getenv("LOCKSTEP_SPAWN_TEST"),
                                               std::getenv("OMP_NUM_THREADS")));
      },
      options);
  const char* outer = std::getenv("OMP_NUM_THREADS");
  const std::string threads = outer != nullptr ? outer : "1";
  CHECK(read_text(dir.file(0)) == "yes " + threads);
  CHECK(read_text(dir.file(1)) == "yes " + threads);
}

TEST_CASE("spawn: OMP_NUM_THREADS in options.env sets each child's CPU kernel threads",
          "[spawn]") {
  ScratchDir dir;
  SpawnOptions options;
  options.env = {{"OMP_NUM_THREADS", "3"}};
  spawn(
      2,
      [&](int rank) {
        write_text(dir.file(rank), fmt::format("{} {}", std::getenv("OMP_NUM_THREADS"),
                                               lockstep::runtime::num_threads()));
      },
      options);
  CHECK(read_text(dir.file(0)) == "3 3");
  CHECK(read_text(dir.file(1)) == "3 3");
  options.env = {{"OMP_NUM_THREADS", "many"}};
  CHECK_THAT(spawn_error(1, [](int) {}, options).what(),
             Catch::Contains("OMP_NUM_THREADS='many' is not a whole number"));
}

namespace {

volatile sig_atomic_t g_stop_signal = 0;

// fn for the signal test: each rank says it is ready, waits up to 20 s for
// SIGINT or SIGTERM, and on one writes down which ("saved its work") and
// exits 0.
void wait_for_stop(const ScratchDir& dir, int rank) {
  for (int sig : {SIGINT, SIGTERM}) ::signal(sig, [](int s) { g_stop_signal = s; });
  write_text(dir.path / fmt::format("ready{}", rank), "");
  for (int i = 0; i < 2000 && g_stop_signal == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  write_text(dir.file(rank), std::to_string(g_stop_signal));
}

// Waits until every one of `nprocs` ranks of wait_for_stop is ready.
void wait_until_ready(const ScratchDir& dir, int nprocs) {
  for (int r = 0; r < nprocs; ++r)
    while (!fs::exists(dir.path / fmt::format("ready{}", r)))
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

// For its scope, the caller's own SIGINT handler: it notes the signal in
// g_stop_signal (cleared here).
class CallerNotesSigint {
 public:
  CallerNotesSigint() {
    struct sigaction note {};
    note.sa_handler = [](int s) { g_stop_signal = s; };
    sigemptyset(&note.sa_mask);
    ::sigaction(SIGINT, &note, &previous_);
    g_stop_signal = 0;
  }
  ~CallerNotesSigint() { ::sigaction(SIGINT, &previous_, nullptr); }
  CallerNotesSigint(const CallerNotesSigint&) = delete;
  CallerNotesSigint& operator=(const CallerNotesSigint&) = delete;

 private:
  struct sigaction previous_ {};
};

}  // namespace

TEST_CASE("spawn passes a SIGINT or SIGTERM it is sent on to every child, then raises it again",
          "[spawn]") {
  // With the caller's own handler: it runs, and spawn returns as its ranks
  // did (each saved its work on the signal and exited 0).
  {
    ScratchDir dir;
    const CallerNotesSigint handler;
    std::thread ctrl_c([&] {
      wait_until_ready(dir, 2);
      ::kill(::getpid(), SIGINT);
    });
    const auto start = std::chrono::steady_clock::now();
    CHECK_NOTHROW(spawn(2, [&](int rank) { wait_for_stop(dir, rank); }));
    ctrl_c.join();
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
    CHECK(g_stop_signal == SIGINT);
    for (int r = 0; r < 2; ++r) CHECK(read_text(dir.file(r)) == std::to_string(SIGINT));
  }
  // With the default handling, in a process of its own: the ranks save their
  // work, then the signal ends the caller.
  ScratchDir dir;
  g_stop_signal = 0;
  const pid_t caller = ::fork();
  REQUIRE(caller >= 0);
  if (caller == 0) {
    ::signal(SIGTERM, SIG_DFL);
    try {
      spawn(3, [&](int rank) { wait_for_stop(dir, rank); });
    } catch (...) {
    }
    ::_exit(0);
  }
  wait_until_ready(dir, 3);
  ::kill(caller, SIGTERM);
  int status = 0;
  REQUIRE(::waitpid(caller, &status, 0) == caller);
  CHECK(WIFSIGNALED(status));
  CHECK((WIFSIGNALED(status) ? WTERMSIG(status) : 0) == SIGTERM);
  for (int r = 0; r < 3; ++r) CHECK(read_text(dir.file(r)) == std::to_string(SIGTERM));
}

TEST_CASE("spawn: a signal while the children stop after a failure kills them at once",
          "[spawn]") {
  // Ranks 1 and 2 note SIGTERM and SIGINT and keep running (up to 30 s): a
  // grace period of 60 s would keep spawn waiting for them. Rank 0 fails once
  // they are ready; the caller's Ctrl-C comes once both have had the SIGTERM
  // that the failure sent them.
  ScratchDir dir;
  const CallerNotesSigint handler;
  const auto told = [&](int rank) { return dir.path / fmt::format("told{}", rank); };
  std::thread ctrl_c([&] {
    while (!fs::exists(told(1)) || !fs::exists(told(2)))
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ::kill(::getpid(), SIGINT);
  });
  SpawnOptions options;
  options.grace_period = std::chrono::seconds(60);
  const auto start = std::chrono::steady_clock::now();
  const SpawnError e = spawn_error(
      3,
      [&](int rank) {
        if (rank == 0) {
          write_text(dir.path / "ready0", "");
          wait_until_ready(dir, 3);
          throw lockstep::Error("rank 0 gives up");
        }
        for (int sig : {SIGINT, SIGTERM}) ::signal(sig, [](int s) { g_stop_signal = s; });
        write_text(dir.path / fmt::format("ready{}", rank), "");
        for (int i = 0; i < 3000; ++i) {
          if (g_stop_signal == SIGTERM && !fs::exists(told(rank))) write_text(told(rank), "");
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      },
      options);
  ctrl_c.join();
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
  CHECK(g_stop_signal == SIGINT);  // raised again under the caller's handler
  CHECK(e.rank() == 0);
  CHECK_THAT(e.what(), Catch::Contains("threw: rank 0 gives up; stopped the other 2 ranks, then "
                                       "killed them on the SIGINT spawn was sent"));
}

namespace {

// The state letter of /proc/PID/stat ('T': stopped), or '?' when gone.
char process_state(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string line;
  std::getline(in, line);
  const auto close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() ? '?' : line[close + 2];
}

}  // namespace

TEST_CASE("spawn: Ctrl-Z stops the children with the caller, fg continues them, and the time "
          "stopped does not count toward the timeout",
          "[spawn]") {
  // Each child writes its pid, then counts until the test says it is done.
  // The children lead process groups of their own: a terminal's SIGTSTP
  // reached the caller alone, and they ran on while the job looked stopped.
  ScratchDir dir;
  const auto count_of = [&](int rank) {
    return read_text(dir.path / fmt::format("count{}", rank));
  };
  const pid_t caller = ::fork();
  REQUIRE(caller >= 0);
  if (caller == 0) {
    SpawnOptions options;
    options.timeout = std::chrono::seconds(3);
    try {
      spawn(2, [&](int rank) {
        write_text(dir.file(rank), std::to_string(::getpid()));
        for (int i = 0; i < 2000 && !fs::exists(dir.path / "done"); ++i) {
          write_text(dir.path / fmt::format("count{}.tmp", rank), std::to_string(i));
          fs::rename(dir.path / fmt::format("count{}.tmp", rank),
                     dir.path / fmt::format("count{}", rank));
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }, options);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      ::_exit(1);
    }
    ::_exit(0);
  }
  REQUIRE(lt::eventually([&] { return !count_of(0).empty() && !count_of(1).empty(); }));
  const pid_t children[2] = {std::stoi(read_text(dir.file(0))), std::stoi(read_text(dir.file(1)))};
  ::kill(caller, SIGTSTP);
  int status = 0;
  REQUIRE(::waitpid(caller, &status, WUNTRACED) == caller);
  CHECK(WIFSTOPPED(status));
  for (pid_t child : children) CHECK(lt::eventually([&] { return process_state(child) == 'T'; }));
  const std::string counts = count_of(0) + " " + count_of(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));  // past the timeout
  CHECK(count_of(0) + " " + count_of(1) == counts);
  ::kill(caller, SIGCONT);
  CHECK(lt::eventually([&] { return count_of(0) + " " + count_of(1) != counts; }));
  for (pid_t child : children) CHECK(process_state(child) != 'T');
  write_text(dir.path / "done", "");
  REQUIRE(::waitpid(caller, &status, 0) == caller);
  CHECK(WIFEXITED(status));
  CHECK((WIFEXITED(status) ? WEXITSTATUS(status) : -1) == 0);  // no timeout
}

TEST_CASE("spawn: a child reads stdin from /dev/null, not the caller's terminal", "[spawn]") {
  // The caller runs on a terminal of its own (a pty), as from a shell. The
  // children lead process groups of their own, never the terminal's
  // foreground one: a child reading it was stopped for good (SIGTTIN), and
  // spawn waited for it until the timeout.
  ScratchDir dir;
  int terminal = -1;
  const pid_t caller = ::forkpty(&terminal, nullptr, nullptr, nullptr);
  REQUIRE(caller >= 0);
  if (caller == 0) {
    SpawnOptions options;
    options.timeout = std::chrono::seconds(10);
    try {
      spawn(1, [&](int rank) {
        char c = 0;
        write_text(dir.file(rank), std::to_string(::read(STDIN_FILENO, &c, 1)));
      }, options);
    } catch (const std::exception&) {
      ::_exit(1);
    }
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(caller, &status, 0) == caller);
  ::close(terminal);
  CHECK((WIFEXITED(status) ? WEXITSTATUS(status) : -1) == 0);
  CHECK(read_text(dir.file(0)) == "0");  // end of file at once
}

TEST_CASE("spawn refuses nprocs < 1 and an empty function", "[spawn]") {
  CHECK_THROWS_WITH(spawn(0, [](int) {}), Catch::Contains("nprocs must be at least 1, got 0"));
  CHECK_THROWS_WITH(spawn(2, std::function<void(int)>()), Catch::Contains("fn is empty"));
}

TEST_CASE("spawn refuses options that cannot mean what the caller wants, before a child starts",
          "[spawn]") {
  // A timeout of 0 (\"none\" to lockstep-run's --hang-timeout) stopped every
  // child at once as hung; env's RANK or WORLD_SIZE made each child another
  // rank, or waited for ranks that never come; a name with '=' was dropped.
  ScratchDir dir;
  const auto refused = [&](const SpawnOptions& options) {
    return lt::error_of([&] {
      spawn(2, [&](int rank) { write_text(dir.file(rank), ""); }, options);
    });
  };
  SpawnOptions zero_timeout;
  zero_timeout.timeout = std::chrono::milliseconds(0);
  CHECK_THAT(refused(zero_timeout),
             Catch::Contains("SpawnOptions::timeout is 0 ms; give a positive time, or leave it "
                             "empty (std::nullopt) for none"));
  SpawnOptions negative_grace;
  negative_grace.grace_period = std::chrono::milliseconds(-1);
  CHECK_THAT(refused(negative_grace), Catch::Contains("SpawnOptions::grace_period is -1 ms"));
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCKSTEP_STORE_ADDR", "LOCKSTEP_TOKEN"}) {
    SpawnOptions own;
    own.env = {{name, "4"}};
    CHECK_THAT(refused(own), Catch::Contains(fmt::format(
                                 "SpawnOptions::env sets {}, which spawn sets for each rank itself",
                                 name)));
  }
  for (const char* name : {"", "A=B"}) {
    SpawnOptions bad;
    bad.env = {{name, "x"}};
    CHECK_THAT(refused(bad), Catch::Contains(fmt::format("SpawnOptions::env: '{}' is not a "
                                                         "variable name", name)));
  }
  CHECK_FALSE(fs::exists(dir.file(0)));
  CHECK_FALSE(fs::exists(dir.file(1)));
}

TEST_CASE("spawn makes room for its children's descriptors under the hard open-file limit",
          "[spawn]") {
  // Six children need about 24 descriptors in the parent (pipes, pidfds, the
  // store's connections); the soft limit leaves room for 8.
  ScratchDir dir;
  const std::string error = lt::error_in_forked_child([&] {
    lt::limit_open_files(8);
    spawn(6, [&](int rank) {
      auto group = lockstep::collectives::init_process_group();
      Tensor t = Tensor::from_vector(std::vector<float>{1.0f}, {1});
      group->allreduce(t)->wait();
      write_text(dir.file(rank), fmt::format("{}", t.to_vector<double>()[0]));
    });
  });
  CHECK(error == "<no exception>");
  for (int r = 0; r < 6; ++r) CHECK(read_text(dir.file(r)) == "6");
}

TEST_CASE("spawn refuses more children than the hard open-file limit lets it hold, before "
          "starting any",
          "[spawn]") {
  ScratchDir dir;
  const std::string error = lt::error_in_forked_child([&] {
    lt::limit_open_files(8, 32);
    spawn(100, [&](int rank) { write_text(dir.file(rank), "started"); });
  });
  CHECK_THAT(error, Catch::Contains("spawn: 100 processes need about 416 more open files"));
  CHECK_THAT(error, Catch::Contains("ulimit -Hn"));
  CHECK(fs::is_empty(dir.path));
}

TEST_CASE("spawn runs DDP training: every rank ends with the parameters of one process "
          "training on the whole batch",
          "[spawn][ddp]") {
  ScratchDir dir;
  const auto batch = lt::global_batch(16, 3);
  const int steps = 3;
  const auto train = [&](lockstep::nn::Module& model, lockstep::nn::Module& runner,
                         const lt::Batch& b) {
    lockstep::optim::SGD sgd(model.parameters(), {.lr = 0.1});
    for (int s = 0; s < steps; ++s) {
      sgd.zero_grad();
      lt::loss_of(runner, b).backward();
      sgd.step();
    }
  };
  spawn(2, [&](int rank) {
    auto group = lockstep::collectives::init_process_group();
    auto model = lt::small_mlp(7);
    lockstep::nn::DistributedDataParallel ddp(model, group);
    train(*model, ddp, lt::shard(batch, rank, 2));
    std::string text;
    for (const Tensor& p : model->parameters())
      for (double v : p.to_vector<double>()) text += fmt::format("{:.9g} ", v);
    write_text(dir.file(rank), text);
  });

  auto alone = lt::small_mlp(7);
  train(*alone, *alone, batch);
  std::vector<double> expected;
  for (const Tensor& p : alone->parameters())
    for (double v : p.to_vector<double>()) expected.push_back(v);

  const std::string rank0 = read_text(dir.file(0));
  CHECK(read_text(dir.file(1)) == rank0);  // every rank took the same steps
  std::istringstream in(rank0);
  for (size_t i = 0; i < expected.size(); ++i) {
    double v = 0;
    REQUIRE(in >> v);
    INFO("parameter value " << i);
    CHECK(v == Approx(expected[i]).epsilon(1e-5).margin(1e-6));
  }
}

TEST_CASE("spawn from a program's main: its ranks select their device and all-reduce",
          "[spawn][multiprocess]") {
  using namespace std::chrono_literals;
  const auto result = lt::run_process(
      {lt::bin_path("spawn_worker"), "--nprocs", "3", "--device", "cpu"}, 120s);
  INFO(lt::describe(result) << "\n" << result.output);
  REQUIRE(result.ok());
  for (int r = 0; r < 3; ++r)
    CHECK(result.output.find(fmt::format("spawn_worker rank {}/3 on cpu (", r)) !=
          std::string::npos);
}
