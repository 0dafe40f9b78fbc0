// lockstep-run and signals: to the ranks, to the launcher (forwarded, Ctrl-Z,
// SIGKILL), and a launcher started ignoring SIGINT. Each test starts the real
// launcher with the launcher_probe worker (tests/workers/launcher_probe.cpp).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "support/test_util.h"
#include "launcher/launch_probe.h"

using lockstep::testing::bin_path;
using lockstep::testing::check_no_orphans;
using lockstep::testing::describe;
using lockstep::testing::eventually;
using lockstep::testing::kLimit;
using lockstep::testing::launch;
using lockstep::testing::pids_in;
using lockstep::testing::probe_lines;
using lockstep::testing::run_process;
using Catch::Matchers::Contains;
using lockstep::testing::TempDir;
using namespace std::chrono_literals;

namespace {

// Alive and not a zombie (a killed orphan may wait a while for whoever
// adopted it to reap it; it is gone all the same).
bool running(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() || text[paren + 2] != 'Z';
}

// A process the test itself starts, so that it can SIGKILL it: output to
// `log`, in its own process group; killed and reaped at the end if still there.
struct Background {
  pid_t pid = -1;
  Background(const std::vector<std::string>& argv, const std::string& log) {
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      setpgid(0, 0);
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  ~Background() {
    if (pid > 0) {
      kill(-pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  int kill_and_reap(int sig) {
    kill(pid, sig);
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    return status;
  }
};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The directory of flight records (in /dev/shm: memory) of the launcher whose
// probes print LOCKSTEP_FLIGHT_RECORDER to `log`; empty if none did in time.
std::filesystem::path flight_record_dir(const std::string& log) {
  const std::string key = "LOCKSTEP_FLIGHT_RECORDER=";
  std::string text;
  if (!eventually([&] { return (text = read_file(log)).find(key) != std::string::npos; }, kLimit))
    return {};
  const auto at = text.find(key) + key.size();
  return std::filesystem::path(text.substr(at, text.find_first_of(" \n", at) - at)).parent_path();
}

// The pid of `launcher`'s reaper (its child named lockstep-reaper), or -1.
pid_t reaper_of(pid_t launcher) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file(entry.path().string() + "/stat");
    const auto open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos || close + 4 >= stat.size() ||
        stat.substr(open + 1, close - open - 1) != "lockstep-reaper")
      continue;
    if (std::stoi(stat.substr(close + 4)) == launcher) return std::stoi(name);  // ") S <ppid>"
  }
  return -1;
}

// A process's state letter from /proc/<pid>/stat ('T': stopped); 0 if gone.
char process_state(pid_t pid) {
  const std::string stat = read_file(fmt::format("/proc/{}/stat", pid));
  const auto paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() ? 0 : stat[paren + 2];
}

}  // namespace

TEST_CASE("launcher: a rank's group left with only a zombie is not waited for", "[launcher]") {
  // The zombie's parent, outside the group, does not wait for it (a
  // container's init that does not reap): the group cannot be killed or
  // stop, and the launcher waited out the whole grace period for it.
  const auto r = launch({"-np", "2", "--grace-period", "600"},
                        {"zombie=0", "zombie=1", "exit=0:3", "exit=1:0"});
  CHECK(!r.timed_out);
  CHECK(r.exit_code == 3);
  CHECK_THAT(r.output, Contains("exited with code 3") && !Contains("SIGKILL"));
}

TEST_CASE("launcher: ranks that ignore SIGTERM get SIGKILL after the grace period", "[launcher]") {
  TempDir dir;
  const auto r = launch({"-np", "2", "--grace-period", "0.5"},
                        {"pid-dir=" + dir.str(), "ignore-term", "exit=0:4", "sleep"});
  CHECK(r.exit_code == 4);
  CHECK_THAT(r.output, Contains("rank 1") && Contains("did not stop within 0.5 s; sending SIGKILL"));
  check_no_orphans(dir.str(), 2);
}

TEST_CASE("launcher: a rank killed by a signal is named with the signal", "[launcher]") {
  TempDir dir;
  const auto r = launch({"-np", "2"}, {"pid-dir=" + dir.str(), "kill=0:9", "sleep"});
  CHECK(r.exit_code == 128 + SIGKILL);
  CHECK_THAT(r.output, Contains("rank 0 (local rank 0 on node 0") &&
                           Contains("was killed by SIGKILL"));
  check_no_orphans(dir.str(), 2);
}

TEST_CASE("launcher: SIGTERM to the launcher is forwarded to every rank", "[launcher]") {
  TempDir dir;
  // Rank 1 signals its parent, the launcher, once every rank is running.
  const auto r = launch({"-np", "3"}, {"pid-dir=" + dir.str(), "kill-parent=1:15", "sleep"});
  CHECK(r.exit_code == 128 + SIGTERM);
  CHECK_THAT(r.output, Contains("received SIGTERM; forwarding it to 3 ranks"));
  check_no_orphans(dir.str(), 3);
}

TEST_CASE("launcher: SIGUSR1 and SIGUSR2 to the launcher are passed on to every rank, which "
          "run on",
          "[launcher]") {
  // As mpirun does: a batch system's warning before its time limit, on which
  // the ranks save a checkpoint. Each rank, a shell, says it got the signal
  // and exits 0 at the second; before, the first ended the launcher and with
  // it every rank.
  TempDir dir;
  const std::string rank = dir.str() + "/rank.sh";
  std::ofstream(rank) << "#!/bin/sh\n"
                         "trap 'echo \"rank $RANK got USR1\"; touch \"$0.$RANK.usr1\"' USR1\n"
                         "trap 'echo \"rank $RANK got USR2\"; exit 0' USR2\n"
                         "touch \"$0.$RANK.ready\"\n"
                         "while :; do sleep 0.1; done\n";
  std::filesystem::permissions(rank, std::filesystem::perms::owner_all);
  const std::string script = fmt::format(
      "{0} -np 2 {1} 2>&1 & launcher=$!; "
      "for i in $(seq 200); do [ -e {1}.0.ready ] && [ -e {1}.1.ready ] && break; sleep 0.1; "
      "done; kill -USR1 $launcher; "
      "for i in $(seq 200); do [ -e {1}.0.usr1 ] && [ -e {1}.1.usr1 ] && break; sleep 0.1; done; "
      "kill -USR2 $launcher; wait $launcher; echo \"launcher exit $?\"",
      bin_path("lockstep-run"), rank);
  const auto r = run_process({"/bin/bash", "-c", script}, kLimit);
  INFO(describe(r) << "\n" << r.output);
  CHECK_THAT(r.output, Contains("received SIGUSR1; forwarding it to 2 ranks") &&
                           Contains("rank 0 got USR1") && Contains("rank 1 got USR1") &&
                           Contains("rank 0 got USR2") && Contains("rank 1 got USR2") &&
                           Contains("launcher exit 0"));
}

TEST_CASE("launcher: the first outcome wins when another node fails in the same wake-up",
          "[launcher]") {
  // A SIGTERM and another node's failure both ready before the supervisor's
  // first poll(): the signal, handled first, stays the outcome, and the job
  // is stopped once.
  const auto r = run_process({bin_path("supervisor_probe"), "signal-and-remote"}, kLimit);
  INFO(describe(r) << "\n" << r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("received SIGTERM") &&
                           Contains("exit_code=143 outcome=signalled stop_signal=15 told=1 before_stop=1") &&
                           !Contains("node 1: rank 1 failed"));
}

TEST_CASE("launcher: a group that lingers after its rank is looked for in /proc a bounded "
          "number of times over the grace period",
          "[launcher]") {
  // The rank leaves a process that ignores SIGTERM in its group and exits 3;
  // for the 3 s grace period the group holds a living process. The /proc scan
  // that tells that from zombies reads every process's stat file: it was
  // done twice on each 100 ms tick (about 60 times), now after waits that
  // double up to 1 s (about 7; fewer when the machine is slow).
  const auto r = run_process({bin_path("supervisor_probe"), "lingering-group"}, kLimit);
  INFO(describe(r) << "\n" << r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("did not stop within 3 s; sending them SIGKILL") &&
                           Contains("exit_code=3 outcome=rank_failed stop_signal=0 told=0 before_stop=1 "
                                    "scans="));
  const auto at = r.output.find("scans=");
  REQUIRE(at != std::string::npos);
  const int scans = std::stoi(r.output.substr(at + 6));
  CHECK(scans >= 1);
  CHECK(scans <= 12);
}

TEST_CASE("launcher: stopping the job also stops what a rank started that outlives the rank, "
          "SIGKILL after the grace period for what ignores SIGTERM",
          "[launcher]") {
  TempDir dir;
  // Rank 0, a shell, starts a probe that ignores SIGTERM (a data loader's
  // worker, say) and waits; rank 1 fails once that probe is there. The
  // shell ends at the launcher's SIGTERM; the probe would live on.
  const std::string script = fmt::format(
      "if [ \"$LOCKSTEP_RANK\" = 0 ]; then \"$0\" ignore-term pid-dir={0} sleep & sleep 300; "
      "else while [ ! -e {0}/0.pid ]; do sleep 0.05; done; exit 3; fi",
      dir.str());
  const auto r = run_process({bin_path("lockstep-run"), "-np", "2", "--grace-period", "0.5",
                              "/bin/sh", "-c", script, bin_path("launcher_probe")},
                             kLimit);
  INFO("lockstep-run " << describe(r) << ", output:\n" << r.output);
  CHECK(r.exit_code == 3);
  const auto started = pids_in(dir.str());
  REQUIRE(started.size() == 1);
  CHECK_THAT(r.output, Contains("processes it started did not stop within 0.5 s; sending them "
                                "SIGKILL"));
  // Generous: the machine may be busy; the probe must end, not linger.
  CHECK(eventually([&] { return !running(started[0]); }, 20s));
  if (running(started[0])) kill(started[0], SIGKILL);  // do not leave it behind
}

TEST_CASE("launcher: a SIGKILLed launcher takes the ranks' children with it, wrapper or not, "
          "and leaves no scratch files behind",
          "[launcher]") {
  TempDir dir;
  // `; true` keeps sh from exec'ing the probe: each rank is a shell and the
  // probe (which writes the pid file, then sleeps) is its child.
  Background launcher({bin_path("lockstep-run"), "-np", "2", "/bin/sh", "-c", "\"$0\" \"$@\"; true",
                       bin_path("launcher_probe"), "print", "show=LOCKSTEP_FLIGHT_RECORDER",
                       "pid-dir=" + dir.str(), "sleep"},
                      dir.str() + "/launcher.log");
  const bool started = eventually([&] { return pids_in(dir.str()).size() == 2; }, kLimit);
  INFO("launcher output:\n" << read_file(dir.str() + "/launcher.log"));
  REQUIRE(started);
  const auto scratch = flight_record_dir(dir.str() + "/launcher.log");
  INFO("scratch directory " << scratch);
  REQUIRE(std::filesystem::is_directory(scratch));
  const auto grandchildren = pids_in(dir.str());
  for (pid_t pid : grandchildren) REQUIRE(running(pid));

  const int status = launcher.kill_and_reap(SIGKILL);
  CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
  // Generous: the machine may be busy; the orphans must end, not linger.
  const bool gone = eventually(
      [&] {
        for (pid_t pid : grandchildren) {
          if (running(pid)) return false;
        }
        return true;
      },
      20s);
  CHECK(gone);
  for (pid_t pid : grandchildren) {
    if (running(pid)) kill(pid, SIGKILL);  // do not leave them behind
  }
  CHECK(eventually([&] { return !std::filesystem::exists(scratch); }, 20s));
}

TEST_CASE("launcher: started with stdin closed, a SIGKILLed launcher still takes the ranks' "
          "children with it",
          "[launcher]") {
  // The reaper's pipe used to take descriptor 0, which the reaper then
  // replaced by /dev/null: it saw end of file at once and was gone.
  TempDir dir;
  Background launcher({"/bin/sh", "-c", "exec \"$0\" \"$@\" <&-", bin_path("lockstep-run"),
                       "-np", "1", "/bin/sh", "-c", "\"$0\" \"$@\"; true",
                       bin_path("launcher_probe"), "pid-dir=" + dir.str(), "sleep"},
                      dir.str() + "/launcher.log");
  const bool started = eventually([&] { return pids_in(dir.str()).size() == 1; }, kLimit);
  INFO("launcher output:\n" << read_file(dir.str() + "/launcher.log"));
  REQUIRE(started);
  const pid_t grandchild = pids_in(dir.str()).front();
  REQUIRE(running(grandchild));
  launcher.kill_and_reap(SIGKILL);
  CHECK(eventually([&] { return !running(grandchild); }, 5s));
  if (running(grandchild)) kill(grandchild, SIGKILL);  // do not leave it behind
}

TEST_CASE("launcher: a launcher killed with its reaper leaves its scratch files to the next "
          "launcher, which removes them and keeps a live launcher's",
          "[launcher]") {
  // As a cgroup's SIGKILL or `pkill -KILL -P` ends a job: every process at
  // once, the reaper too, so nobody removes the launcher's directory.
  TempDir dir;
  const auto start = [&](const std::string& name) {
    return std::make_unique<Background>(
        std::vector<std::string>{bin_path("lockstep-run"), "-np", "1", bin_path("launcher_probe"),
                                 "print", "show=LOCKSTEP_FLIGHT_RECORDER", "sleep"},
        dir.str() + "/" + name + ".log");
  };
  auto killed = start("killed");
  auto live = start("live");
  const auto killed_dir = flight_record_dir(dir.str() + "/killed.log");
  const auto live_dir = flight_record_dir(dir.str() + "/live.log");
  INFO("killed " << killed_dir << ", live " << live_dir);
  REQUIRE(std::filesystem::is_directory(killed_dir));
  REQUIRE(std::filesystem::is_directory(live_dir));
  const pid_t reaper = reaper_of(killed->pid);
  REQUIRE(reaper > 0);
  // Stopped first, so that it cannot clean up after its rank's death.
  REQUIRE(kill(killed->pid, SIGSTOP) == 0);
  REQUIRE(eventually([&] { return process_state(killed->pid) == 'T'; }, kLimit));
  const auto children = run_process(
      {"/bin/sh", "-c", fmt::format("pkill -KILL -P {}", killed->pid)}, kLimit);
  REQUIRE(children.ok());  // the reaper and the rank, before the launcher
  killed->kill_and_reap(SIGKILL);
  // Nobody of that job is left to remove its directory (a launcher of another
  // test running meanwhile may sweep it already).
  REQUIRE(eventually([&] { return !running(reaper); }, kLimit));

  const auto next = launch({"-np", "1"}, {"print"});
  CHECK(next.ok());
  CHECK_FALSE(std::filesystem::exists(killed_dir));
  CHECK(std::filesystem::is_directory(live_dir));
}

TEST_CASE("launcher: Ctrl-Z stops the ranks with the launcher; fg continues them, not as hung",
          "[launcher][hang]") {
  TempDir dir;
  const std::string log = dir.str() + "/launcher.log";
  Background launcher({bin_path("lockstep-run"), "-np", "2", "--hang-timeout", "1",
                       bin_path("launcher_probe"), "pid-dir=" + dir.str(), "group-sum",
                       "busy-sleep-ms=6000", "then-allreduce"},
                      log);
  // Both ranks beat (they joined their group) and sleep, busy.
  REQUIRE(eventually([&] {
    const std::string text = read_file(log);
    return text.find("group-sum rank=0") != std::string::npos &&
           text.find("group-sum rank=1") != std::string::npos;
  }, kLimit));
  INFO("launcher output:\n" << read_file(log));
  const auto ranks = pids_in(dir.str());
  REQUIRE(ranks.size() == 2);

  REQUIRE(kill(launcher.pid, SIGTSTP) == 0);
  int status = 0;
  REQUIRE(waitpid(launcher.pid, &status, WUNTRACED) == launcher.pid);
  CHECK(WIFSTOPPED(status));
  for (pid_t pid : ranks) {
    INFO("rank pid " << pid);
    CHECK(eventually([&] { return process_state(pid) == 'T'; }, 5s));
  }
  std::this_thread::sleep_for(2500ms);  // stopped for 2.5 times the hang timeout

  REQUIRE(kill(launcher.pid, SIGCONT) == 0);
  for (pid_t pid : ranks) {
    INFO("rank pid " << pid);
    CHECK(eventually([&] { return process_state(pid) != 'T'; }, 5s));
  }
  REQUIRE(eventually([&] { return waitpid(launcher.pid, &status, WNOHANG) > 0; }, kLimit));
  launcher.pid = -1;
  INFO("launcher output:\n" << read_file(log));
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK_THAT(read_file(log), Contains("received SIGTSTP; stopping 2 ranks") &&
                                 !Contains("is hung"));
}

TEST_CASE("launcher: SIGINT reaches the ranks even when the launcher was started ignoring it",
          "[launcher]") {
  TempDir dir;
  // As `lockstep-run ... &` in a script does: SIGINT ignored, inherited through exec.
  const std::string ignoring_sigint = "trap '' INT; exec \"$0\" \"$@\"";
  const auto setup = run_process({"/bin/sh", "-c", ignoring_sigint, bin_path("launcher_probe"),
                                  "print", "sigint"},
                                 kLimit);
  INFO(describe(setup) << "\n" << setup.output);
  REQUIRE(setup.ok());
  REQUIRE_THAT(setup.output, Contains("sigint=ignored"));  // the case under test is real

  SECTION("the ranks start with SIGINT at its default") {
    const auto r = run_process({"/bin/sh", "-c", ignoring_sigint, bin_path("lockstep-run"), "-np",
                                "2", bin_path("launcher_probe"), "print", "sigint"},
                               kLimit);
    INFO(describe(r) << "\n" << r.output);
    REQUIRE(r.ok());
    const auto lines = probe_lines(r.output);
    REQUIRE(lines.size() == 2);
    for (const auto& [rank, kv] : lines) CHECK(kv.at("sigint") == "default");
  }
  SECTION("a SIGINT to the launcher is forwarded and ends them") {
    // Rank 1 sends SIGINT to the launcher. The grace period outlasts the test's
    // limit, so only the forwarded SIGINT itself can end the ranks in time.
    const auto r = run_process({"/bin/sh", "-c", ignoring_sigint, bin_path("lockstep-run"), "-np",
                                "2", "--grace-period", "600", bin_path("launcher_probe"),
                                "pid-dir=" + dir.str(), "kill-parent=1:2", "sleep"},
                               kLimit);
    INFO(describe(r) << "\n" << r.output);
    CHECK_FALSE(r.timed_out);
    CHECK(r.exit_code == 128 + SIGINT);
    CHECK_THAT(r.output, Contains("received SIGINT; forwarding it to 2 ranks"));
    CHECK_THAT(r.output, !Contains("SIGKILL"));
    check_no_orphans(dir.str(), 2);
  }
}

TEST_CASE("launcher: SIGINT to node 0 while it waits for the other nodes ends the job",
          "[launcher]") {
  // Node 0's ranks finish at once; its launcher keeps the store up for node 1,
  // whose rank works for 20 s. A SIGINT there used to exit 0 without a word.
  const int port = lockstep::testing::unused_tcp_port();
  auto node = [&](int rank, const std::string& probe) {
    return fmt::format("{} --nnodes 2 --node-rank {} --nproc-per-node 1 --master-addr 127.0.0.1 "
                       "--master-port {} {} {}",
                       bin_path("lockstep-run"), rank, port, bin_path("launcher_probe"), probe);
  };
  const std::string script = fmt::format(
      "export LOCKSTEP_TOKEN=t; {} & n0=$!; {} & n1=$!; sleep 3; kill -INT $n0; "
      "wait $n0; echo \"node 0 exit $?\"; wait $n1; echo \"node 1 exit $?\"",
      node(0, "group-sum"), node(1, "group-sum busy-sleep-ms=20000"));
  const auto r = run_process({"/bin/bash", "-c", script}, kLimit);
  INFO(r.output);
  CHECK_THAT(r.output, Contains("node 0 exit 130") &&
                           Contains("node 0's launcher received SIGINT while waiting for the "
                                    "other nodes"));
  CHECK_THAT(r.output, !Contains("node 1 exit 0"));
}

TEST_CASE("launcher: a node signalled while only its output's stalled reader keeps it stops the "
          "other nodes at once",
          "[launcher]") {
  // Node 1's rank has ended, its last lines queued for a reader that never
  // reads (sleep holding a fifo open). SIGTERM there used to tell the other
  // nodes only not to restart: node 0 stopped its rank once node 1's launcher
  // had been silent for --node-timeout, and called it killed.
  const int port = lockstep::testing::unused_tcp_port();
  auto node = [&](int rank, const std::string& launcher, const std::string& probe) {
    return fmt::format("{} --nnodes 2 --node-rank {} --nproc-per-node 1 --master-addr 127.0.0.1 "
                       "--master-port {} --postmortem-dir '' {} {} {}",
                       bin_path("lockstep-run"), rank, port, launcher, bin_path("launcher_probe"),
                       probe);
  };
  const std::string script = fmt::format(
      "export LOCKSTEP_TOKEN=t; dir=$(mktemp -d); mkfifo $dir/out; "
      "sleep 30 < $dir/out > /dev/null & reader=$!; {} > $dir/0 2>&1 & n0=$!; "
      "{} > $dir/out 2> $dir/1 & n1=$!; sleep 4; kill -TERM $n1; wait $n1; "
      "echo \"node 1 exit $?\"; wait $n0; echo \"node 0 exit $?\"; kill $reader; "
      "cat $dir/0 $dir/1; rm -rf $dir",
      node(0, "", "group-sum busy-sleep-ms=40000"),
      node(1, "--tag-output", "group-sum print-lines=5000"));
  const auto r = run_process({"/bin/bash", "-c", script}, 60s);
  INFO(describe(r) << "\n" << r.output);
  CHECK(r.seconds < 12);
  CHECK_THAT(r.output, Contains("node 1 exit 143") && Contains("node 0 exit 1") &&
                           Contains("lockstep-run: node 1: node 1's launcher received SIGTERM; "
                                    "stopping the 1 rank on node 0") &&
                           !Contains("has not been heard from"));
  // Node 0's post-mortem has node 1's records: its rank finished, not behind.
  CHECK_THAT(r.output, Contains("every rank finished") && !Contains("is behind"));
}

TEST_CASE("launcher: SIGINT to a node's launcher still waiting for node 0 ends it at once",
          "[launcher]") {
  // Node 0's launcher is not started: node 1's retries connecting to its
  // store, and used to hold the SIGINT until its 60 s connect timeout, then
  // exit 1 blaming the store's address.
  const int port = lockstep::testing::unused_tcp_port();
  const std::string script = fmt::format(
      "export LOCKSTEP_TOKEN=t; {} --nnodes 2 --node-rank 1 --nproc-per-node 1 --master-addr "
      "127.0.0.1 --master-port {} {} print & n1=$!; sleep 1; kill -INT $n1; wait $n1; "
      "echo \"node 1 exit $?\"",
      bin_path("lockstep-run"), port, bin_path("launcher_probe"));
  const auto r = run_process({"/bin/bash", "-c", script}, kLimit);
  INFO(describe(r) << "\n" << r.output);
  CHECK(r.seconds < 10);
  CHECK_THAT(r.output, Contains(fmt::format("received SIGINT while waiting for node 0's launcher "
                                            "at 127.0.0.1:{}; no rank was started",
                                            port)) &&
                           Contains("node 1 exit 130") && !Contains("rank=1"));
}
