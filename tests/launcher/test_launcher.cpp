// lockstep-run end to end: each test starts the real launcher with the
// launcher_probe worker (tests/workers/launcher_probe.cpp) under a time limit.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <iostream>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "support/backend_skip.h"
#include "launcher/launch_probe.h"

using lockstep::testing::bin_path;
using lockstep::testing::check_no_orphans;
using lockstep::testing::describe;
using lockstep::testing::kLimit;
using lockstep::testing::launch;
using lockstep::testing::pids_in;
using lockstep::testing::ProcessResult;
using lockstep::testing::run_process;
using Catch::Matchers::Contains;
using lockstep::testing::TempDir;
using lockstep::testing::two_local_nodes;
using namespace std::chrono_literals;

namespace {

// key=value pairs of each "rank=..." line the probe printed, by rank.
std::map<int, std::map<std::string, std::string>> probe_lines(const std::string& output) {
  std::map<int, std::map<std::string, std::string>> out;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    const auto at = line.find("rank=");
    if (at == std::string::npos || line.find("world=") == std::string::npos) continue;
    std::istringstream words(line.substr(at));
    std::map<std::string, std::string> kv;
    std::string word;
    while (words >> word) {
      const auto eq = word.find('=');
      if (eq != std::string::npos) kv[word.substr(0, eq)] = word.substr(eq + 1);
    }
    out[std::stoi(kv["rank"])] = kv;
  }
  return out;
}

// The CPUs this process may run on (the launcher inherits them).
std::set<int> own_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  std::set<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.insert(cpu);
  }
  return cpus;
}

// Alive and not a zombie (a killed orphan may wait a while for whoever
// adopted it to reap it; it is gone all the same).
bool running(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() || text[paren + 2] != 'Z';
}

// Polls `done` until it holds or `limit` passes.
bool eventually(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
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

}  // namespace

TEST_CASE("launcher: ranks get their variables", "[launcher]") {
  const int n = GENERATE(2, 4);
  INFO("-np " << n);
  const auto r = launch({"-np", std::to_string(n)},
                        {"print", "show=LOCKSTEP_STORE_ADDR", "show=LOCKSTEP_TOKEN",
                         "show=RANK", "show=WORLD_SIZE", "show=LOCAL_RANK", "show=LOCAL_WORLD_SIZE",
                         "show=MASTER_ADDR", "show=MASTER_PORT", "show=OMP_NUM_THREADS",
                         "show=LOCKSTEP_NUM_NODES"});
  REQUIRE(r.ok());
  const auto lines = probe_lines(r.output);
  REQUIRE(lines.size() == static_cast<size_t>(n));
  std::set<std::string> addrs, tokens;
  for (const auto& [rank, kv] : lines) {
    INFO("rank " << rank);
    CHECK(kv.at("source") == "lockstep-run");
    CHECK(kv.at("world") == std::to_string(n));
    CHECK(kv.at("local") == std::to_string(rank));
    CHECK(kv.at("local_world") == std::to_string(n));
    CHECK(kv.at("node") == "0");
    CHECK(kv.at("RANK") == std::to_string(rank));
    CHECK(kv.at("WORLD_SIZE") == std::to_string(n));
    CHECK(kv.at("LOCAL_RANK") == std::to_string(rank));
    CHECK(kv.at("LOCAL_WORLD_SIZE") == std::to_string(n));
    CHECK(kv.at("OMP_NUM_THREADS") == "1");
    CHECK(kv.at("LOCKSTEP_NUM_NODES") == "1");
    CHECK(kv.at("LOCKSTEP_STORE_ADDR") ==
          kv.at("MASTER_ADDR") + ":" + kv.at("MASTER_PORT"));
    CHECK(std::regex_match(kv.at("LOCKSTEP_STORE_ADDR"), std::regex(R"(127\.0\.0\.1:[1-9][0-9]*)")));
    CHECK(std::regex_match(kv.at("LOCKSTEP_TOKEN"), std::regex("[0-9a-f]{32}")));
    addrs.insert(kv.at("LOCKSTEP_STORE_ADDR"));
    tokens.insert(kv.at("LOCKSTEP_TOKEN"));
  }
  CHECK(addrs.size() == 1);
  CHECK(tokens.size() == 1);
}

TEST_CASE("launcher: all ranks reach the same store", "[launcher]") {
  const auto r = launch({"-np", "3"}, {"store-sum"});
  CHECK(r.ok());
  for (int rank = 0; rank < 3; ++rank)
    CHECK_THAT(r.output, Contains(fmt::format("store-sum rank={} sum=6 expected=6 ok", rank)));
}

TEST_CASE("launcher: --tag-output prefixes every line with its rank", "[launcher]") {
  const auto r = launch({"-np", "2", "--tag-output"}, {"print", "partial"});
  REQUIRE(r.ok());
  std::istringstream in(r.output);
  std::string line;
  int tagged = 0;
  while (std::getline(in, line)) {
    INFO(line);
    std::smatch m;
    REQUIRE(std::regex_match(line, m, std::regex(R"(\[rank (\d)\] (.*))")));
    const std::string rank = m[1];
    const std::string rest = m[2];
    CHECK((rest.rfind("rank=" + rank + " ", 0) == 0 || rest == "partial line of rank " + rank));
    ++tagged;
  }
  CHECK(tagged == 4);  // a full and a partial line from each rank
}

TEST_CASE("launcher: --tag-output tags each redraw of a progress line; a line without end is not "
          "held back",
          "[launcher]") {
  // "\r" redraws, "\r\n" ends a line once, and 100,000 bytes with no line end
  // come out in pieces of at most LineTagger::kMaxPending (64 KiB), each tagged.
  const auto r = run_process(
      {bin_path("lockstep-run"), "-np", "1", "--tag-output", "/bin/sh", "-c",
       "printf '10%%\r20%%\r\n'; head -c 100000 /dev/zero | tr '\\0' x; sleep 0.5; "
       "printf '\nend\n'"},
      kLimit);
  INFO(describe(r) << "\n" << r.output.substr(0, 300));
  REQUIRE(r.ok());
  CHECK_THAT(r.output, Contains("[rank 0] 10%\r[rank 0] 20%\r\n[rank 0] x"));
  CHECK(std::count(r.output.begin(), r.output.end(), 'x') == 100000);
  std::istringstream in(r.output);
  std::string line;
  std::vector<size_t> sizes;
  while (std::getline(in, line)) {
    CHECK(line.rfind("[rank 0] ", 0) == 0);
    sizes.push_back(line.size());
  }
  // The progress line, the x's in two pieces (the first passed on before
  // the line's end came, half a second later), "end".
  REQUIRE(sizes.size() == 4);
  CHECK(sizes[1] >= 9 + 64 * 1024);
  CHECK_THAT(r.output, Contains("\n[rank 0] end\n"));
}

TEST_CASE("launcher: --tag-output: a stalled reader of the output does not stall the launcher",
          "[launcher]") {
  // Rank 0 prints far more than a pipe and the launcher's queue hold; rank 1
  // fails at once. The launcher's stdout is read only after 4 s, by when the
  // failure must have been handled and said on stderr.
  TempDir dir;
  const std::string script = fmt::format(
      "{} -np 2 --tag-output {} print-lines=0:100000 exit=1:3 2>{}/err | "
      "{{ sleep 4; grep -c 'exited with code 3' {}/err > {}/seen; cat > /dev/null; }}; "
      "echo \"launcher exit ${{PIPESTATUS[0]}}\"; echo \"seen $(cat {}/seen)\"; cat {}/err",
      bin_path("lockstep-run"), bin_path("launcher_probe"), dir.str(), dir.str(), dir.str(),
      dir.str(), dir.str());
  const auto r = run_process({"/bin/bash", "-c", script}, kLimit);
  INFO(describe(r) << "\n" << r.output);
  CHECK_THAT(r.output, Contains("launcher exit 3") && Contains("seen 1") &&
                           Contains("rank 1 (local rank 1 on node 0"));
}

TEST_CASE("launcher: -x exports variables; OMP_NUM_THREADS is kept when set", "[launcher]") {
  const auto r = launch({"-np", "2", "-x", "PROBE_A=hello", "-x", "PROBE_B"},
                        {"print", "show=PROBE_A", "show=PROBE_B", "show=OMP_NUM_THREADS"},
                        {"PROBE_B=from-launcher", "OMP_NUM_THREADS=3"});
  REQUIRE(r.ok());
  const auto lines = probe_lines(r.output);
  REQUIRE(lines.size() == 2);
  for (const auto& [rank, kv] : lines) {
    CHECK(kv.at("PROBE_A") == "hello");
    CHECK(kv.at("PROBE_B") == "from-launcher");
    CHECK(kv.at("OMP_NUM_THREADS") == "3");
  }

  const auto unset = launch({"-np", "1", "-x", "PROBE_SURELY_UNSET_VAR"}, {});
  CHECK(unset.exit_code == 2);
  CHECK_THAT(unset.output, Contains("PROBE_SURELY_UNSET_VAR is not set"));
}

TEST_CASE("launcher: a failing rank stops the others", "[launcher]") {
  TempDir dir;
  const auto r = launch({"-np", "3"}, {"pid-dir=" + dir.str(), "exit=1:3", "sleep"});
  CHECK(r.exit_code == 3);
  CHECK_FALSE(r.timed_out);
  CHECK(r.seconds < 10);
  CHECK_THAT(r.output, Contains("rank 1 (local rank 1 on node 0") &&
                           Contains("exited with code 3; stopping the other 2 ranks"));
  check_no_orphans(dir.str(), 3);
}

TEST_CASE("launcher: a collective failing with no caller waiting ends its rank and the job",
          "[launcher][async_error]") {
  // What the NCCL watchdog does on a timeout (collectives/async_error.h), on
  // rank 1 of 2, in the default setting and in fail-works.
  TempDir dir;
  const auto ended = launch({"-np", "2"}, {"pid-dir=" + dir.str(), "async-failure=1", "sleep"});
  CHECK(ended.exit_code == 1);
  CHECK_FALSE(ended.timed_out);
  CHECK_THAT(ended.output,
             Contains("lockstep: rank 1 of group 'probe' (nccl, 2 ranks): allreduce #3 (f32, "
                      "1024 elements, sum) timed out after 0.3 s; this process ends now, its "
                      "communicator with it") &&
                 Contains("rank 1 (local rank 1 on node 0") &&
                 Contains("exited with code 1; stopping the other 1 rank"));
  CHECK_THAT(ended.output, !Contains("still running"));
  check_no_orphans(dir.str(), 2);

  const auto kept = launch({"-np", "2"}, {"async-failure=1"},
                           {"LOCKSTEP_ASYNC_ERROR_HANDLING=fail-works"});
  CHECK(kept.exit_code == 0);
  CHECK_THAT(kept.output, Contains("rank 1: still running") && !Contains("ends now"));

  const auto bad = launch({"-np", "1"}, {"async-failure=0"},
                          {"LOCKSTEP_ASYNC_ERROR_HANDLING=abort"});
  CHECK(bad.exit_code != 0);
  CHECK_THAT(bad.output, Contains("LOCKSTEP_ASYNC_ERROR_HANDLING='abort': use end-process"));
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

TEST_CASE("launcher: the first outcome wins when another node fails in the same wake-up",
          "[launcher]") {
  // A SIGTERM and another node's failure both ready before the supervisor's
  // first poll(): the signal, handled first, stays the outcome, and the job
  // is stopped once.
  const auto r = run_process({bin_path("supervisor_probe"), "signal-and-remote"}, kLimit);
  INFO(describe(r) << "\n" << r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("received SIGTERM") &&
                           Contains("exit_code=143 outcome=signalled before_stop=1") &&
                           !Contains("node 1: rank 1 failed"));
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
  // The launcher's directory of flight records (in /dev/shm: memory).
  std::string log;
  REQUIRE(eventually([&] {
    log = read_file(dir.str() + "/launcher.log");
    return log.find("LOCKSTEP_FLIGHT_RECORDER=") != std::string::npos;
  }, kLimit));
  const auto at = log.find("LOCKSTEP_FLIGHT_RECORDER=");
  const auto value = log.substr(at + 25, log.find_first_of(" \n", at) - at - 25);
  const auto scratch = std::filesystem::path(value).parent_path();
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

// A process's state letter from /proc/<pid>/stat ('T': stopped); 0 if gone.
char process_state(pid_t pid) {
  const std::string stat = read_file(fmt::format("/proc/{}/stat", pid));
  const auto paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() ? 0 : stat[paren + 2];
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

TEST_CASE("launcher: --max-restarts starts the whole group again after a rank fails",
          "[launcher][restart]") {
  // Rank 1 fails its first two attempts after the group formed; the third
  // forms the group again on the same store (under "restart-2/", clear of
  // the rank claims the first two left) and succeeds.
  const auto r = launch({"-np", "3", "--max-restarts", "3", "--restart-backoff", "0.1"},
                        {"group-sum", "fail-attempts=1:2"}, {}, 60s);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output,
             Contains("rank 1 (local rank 1 on node 0") && Contains("exited with code 7") &&
                 Contains("restart 1 of 3: starting the 3 ranks again in 0.1 s, with "
                          "LOCKSTEP_RESTART_COUNT=1") &&
                 Contains("restart 2 of 3: starting the 3 ranks again in 0.2 s") &&
                 !Contains("restart 3 of 3"));
  for (int rank = 0; rank < 3; ++rank)
    CHECK_THAT(r.output, Contains(fmt::format("group-sum rank={} restart=2 sum=6 ok", rank)));
  CHECK_THAT(r.output, Contains("rank 1: failing attempt 0") &&
                           Contains("rank 1: failing attempt 1") &&
                           !Contains("failing attempt 2"));

  // A success needs no restart; the ranks are told they are attempt 0.
  const auto once = launch({"-np", "2", "--max-restarts", "2"},
                           {"print", "show=LOCKSTEP_RESTART_COUNT"});
  CHECK(once.exit_code == 0);
  CHECK_THAT(once.output, Contains("LOCKSTEP_RESTART_COUNT=0") && !Contains("restart 1"));
}

TEST_CASE("launcher: every rank of every attempt gets the launch's LOCKSTEP_JOB_ID",
          "[launcher][restart]") {
  // The ids each "rank=..." line showed, all of them.
  const auto ids = [](const std::string& output) {
    std::multiset<std::string> out;
    const std::regex id("LOCKSTEP_JOB_ID=(\\S+)");
    for (auto it = std::sregex_iterator(output.begin(), output.end(), id);
         it != std::sregex_iterator(); ++it)
      out.insert((*it)[1]);
    return out;
  };
  // An outer launcher's id is not this launch's.
  const auto r = launch({"-np", "2", "--max-restarts", "1", "--restart-backoff", "0"},
                        {"print", "show=LOCKSTEP_JOB_ID", "fail-attempts=1:1"},
                        {"LOCKSTEP_JOB_ID=outer"});
  CHECK(r.exit_code == 0);
  const auto seen = ids(r.output);
  // Two ranks, two attempts (rank 0 of the first may be stopped before it prints).
  CHECK(seen.size() >= 3);
  REQUIRE_FALSE(seen.empty());
  const std::string job = *seen.begin();
  CHECK(seen.count(job) == seen.size());
  CHECK(job != "outer");
  CHECK(job != "(unset)");

  const auto next = launch({"-np", "1"}, {"print", "show=LOCKSTEP_JOB_ID"});
  CHECK(next.exit_code == 0);
  CHECK(ids(next.output).size() == 1);
  CHECK(ids(next.output).count(job) == 0);  // another launch, another job

  // Several nodes: node 0's id, on every node.
  const auto nodes = two_local_nodes({}, {"print", "show=LOCKSTEP_JOB_ID"},
                                     {"print", "show=LOCKSTEP_JOB_ID"});
  CHECK(nodes.ok());
  const auto both = ids(nodes.output);
  CHECK(both.size() == 2);
  REQUIRE_FALSE(both.empty());
  CHECK(both.count(*both.begin()) == 2);
}

TEST_CASE("launcher: --max-restarts gives up after N restarts, and a signal is not restarted",
          "[launcher][restart]") {
  const auto r = launch({"-np", "2", "--max-restarts", "1", "--restart-backoff", "0"},
                        {"fail-attempts=0:5"});
  CHECK(r.exit_code == 7);
  CHECK_THAT(r.output, Contains("restart 1 of 1") &&
                           Contains("giving up: the ranks failed 2 times, and --max-restarts 1 "
                                    "allows no further restart"));

  TempDir dir;
  const auto stopped = launch({"-np", "2", "--max-restarts", "3"},
                              {"pid-dir=" + dir.str(), "kill-parent=1:15", "sleep"});
  CHECK(stopped.exit_code == 128 + SIGTERM);
  CHECK_THAT(stopped.output, Contains("received SIGTERM") && !Contains("restart 1"));
  check_no_orphans(dir.str(), 2);
}

TEST_CASE("launcher: --max-restarts across two nodes starts every node's ranks again together",
          "[launcher][restart]") {
  // Node 1's rank fails its first attempt after node 0's has finished: node 0
  // learns it, and both start again (the attempt succeeds only when every
  // node's ranks do).
  const auto r = two_local_nodes({"--max-restarts", "2", "--restart-backoff", "0.1"},
                                 {"group-sum", "fail-attempts=1:1"},
                                 {"group-sum", "fail-attempts=1:1", "wait-ms=500"});
  CHECK(r.ok());
  CHECK_THAT(r.output,
             Contains("node 1: rank 1 (local rank 0 on node 1") &&
                 Contains("exited with code 7; node 0's ranks had finished") &&
                 Contains("restart 1 of 2: starting the rank of node 0 again in 0.1 s") &&
                 Contains("restart 1 of 2: starting the rank of node 1 again in 0.1 s") &&
                 Contains("group-sum rank=0 restart=1 sum=3 ok") &&
                 Contains("group-sum rank=1 restart=1 sum=3 ok") && Contains("node 0 exit 0") &&
                 Contains("node 1 exit 0") && !Contains("restart 2 of 2"));

  // A launcher told to stop stops the job: no node restarts.
  const auto stopped = two_local_nodes({"--max-restarts", "2"}, {"sleep"},
                                       {"wait-ms=300", "kill-parent=1:15", "sleep"});
  CHECK(stopped.ok());
  CHECK_THAT(stopped.output,
             Contains("received SIGTERM; forwarding it to 1 rank") &&
                 Contains("not restarting: node 1: node 1's launcher received SIGTERM") &&
                 Contains("node 1 exit 143") && !Contains("restart 1 of 2"));
}

TEST_CASE("launcher: losing node 0 ends the other nodes' launchers within seconds",
          "[launcher][restart]") {
  // Node 0's launcher is killed once both ranks joined; node 1's learns the
  // store is gone, and under --max-restarts its attempt to agree on a restart
  // fails at once instead of reconnecting for the whole connect timeout (60 s).
  const auto r = two_local_nodes({"--max-restarts", "1", "--postmortem-dir", "''"},
                                 {"group-sum", "kill-parent=0:9", "sleep"},
                                 {"group-sum", "sleep"});
  CHECK(!r.timed_out);
  CHECK(r.seconds < 30);
  CHECK_THAT(r.output, Contains("lost the job's store") &&
                           Contains("cannot restart: the job's store is gone") &&
                           Contains("node 1 exit 1"));
}

TEST_CASE("launcher: usage errors exit 2 with a message", "[launcher]") {
  const auto lr = bin_path("lockstep-run");
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{lr, "-np", "2", "no-such-program-xyz"}, "program 'no-such-program-xyz' not found in PATH"},
      {{lr, "-np", "2", "/no/such/dir/prog"}, "program '/no/such/dir/prog' not found"},
      {{lr, "-np", "2"}, "no program given"},
      {{lr, "-np", "0", "true"}, "-np 0 must be at least 1"},
      {{lr, "true"}, "-np N"},
      {{lr, "--bogus", "-np", "1", "true"}, "--bogus"},
      {{lr, "--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "10.0.0.1",
        "--master-port", "29500", "true"},
       "LOCKSTEP_TOKEN"},
      {{lr, "--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "10.0.0.1", "--token",
        "t", "true"},
       "fixed --master-port"},
      {{lr, "--nnodes", "2", "--node-rank", "2", "--nproc-per-node", "1", "true"},
       "--node-rank 2 is out of range"},
      {{lr, "-np", "2", "--bind-to", "socket", "true"}, "--bind-to"},
      {{lr, "-np", "2", "--max-restarts", "-1", "true"}, "--max-restarts -1 must not be negative"},
      {{lr, "-np", "2", "--restart-backoff", "-2", "true"},
       "--restart-backoff -2 must be a number of seconds from 0 to 1e+07"},
      {{lr, "-np", "2", "--hang-timeout", "-1", "true"}, "--hang-timeout -1 must be a number"},
      // NaN and huge values passed and were cast to milliseconds out of range.
      {{lr, "-np", "2", "--hang-timeout", "nan", "true"}, "--hang-timeout nan must be a number"},
      {{lr, "-np", "2", "--grace-period", "1e300", "true"}, "--grace-period 1e+300 must be"},
      {{lr, "-np", "2", "--restart-backoff", "inf", "true"}, "--restart-backoff inf must be"},
      // Every rank used to abort at start-up (exit 134) on a name that does not resolve.
      {{lr, "-np", "2", "--master-addr", "nosuchhost.invalid", "true"},
       "--master-addr nosuchhost.invalid: not an address or a host name that resolves"},
  };
  for (const auto& c : cases) {
    const auto r = run_process(c.args, kLimit, {"LOCKSTEP_TOKEN="});
    INFO(c.args.back() << ": " << describe(r) << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Contains(c.message));
  }

  const auto help = run_process({lr, "--help"}, kLimit);
  CHECK(help.exit_code == 0);
  for (const char* option : {"-np", "--nproc-per-node", "--nnodes", "--node-rank",
                             "--master-addr", "--master-port", "--token", "-x", "--tag-output",
                             "--grace-period", "--bind-to", "--max-restarts",
                             "--restart-backoff", "--hang-timeout"})
    CHECK_THAT(help.output, Contains(option));
}

TEST_CASE("launcher: --master-addr [::1] is the address ::1", "[launcher]") {
  // The brackets reached the ranks as [[::1]]:port and every rank aborted.
  auto run = [](const std::string& addr) {
    return run_process({bin_path("lockstep-run"), "-np", "2", "--master-addr", addr,
                        bin_path("launcher_probe"), "group-sum"},
                       kLimit);
  };
  const auto plain = run("::1"), bracketed = run("[::1]");
  INFO(plain.output << "\n---\n" << bracketed.output);
  CHECK(bracketed.exit_code == plain.exit_code);
  const bool plain_ok = plain.output.find("sum=3 ok") != std::string::npos;
  const bool bracketed_ok = bracketed.output.find("sum=3 ok") != std::string::npos;
  CHECK(bracketed_ok == plain_ok);
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

TEST_CASE("launcher: a script without #! runs under /bin/sh, as execvp runs it", "[launcher]") {
  // execve refuses it (ENOEXEC) and every rank exited 127.
  TempDir dir;
  const std::string script = dir.str() + "/no-shebang";
  std::ofstream(script) << "echo \"rank $RANK of $WORLD_SIZE: $1\"\nexit 3\n";
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  const auto r = run_process({bin_path("lockstep-run"), "-np", "2", script, "hello"}, kLimit);
  INFO(r.output);
  CHECK(r.exit_code == 3);
  CHECK_THAT(r.output, Contains("of 2: hello") && !Contains("Exec format error"));
}

TEST_CASE("launcher: too low an open-file limit is raised, or the job refused before a rank starts",
          "[launcher]") {
  const auto lr = bin_path("lockstep-run");
  TempDir dir;
  // A hard limit of 100 cannot hold 200 ranks' descriptors: refused, nothing started
  // (it used to fail at rank 55 or so, the started ranks killed).
  const auto refused = run_process(
      {"/bin/sh", "-c",
       fmt::format("ulimit -n 100 && exec {} -np 200 /bin/sh -c 'touch {}/started.$RANK'", lr,
                   dir.str())},
      kLimit);
  INFO(describe(refused) << "\n" << refused.output);
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.output, Contains("200 ranks on this node need about") &&
                                 Contains("the hard limit is 100") && Contains("ulimit"));
  CHECK(std::filesystem::is_empty(dir.str()));

  // A soft limit below what 8 ranks need is raised to the hard limit, which
  // the ranks inherit.
  rlimit limit{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &limit) == 0);
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < 200) {
    WARN("skipped the raise: this process's hard limit (" << limit.rlim_max << ") is below 200");
    return;
  }
  const auto raised = run_process(
      {"/bin/sh", "-c", fmt::format("ulimit -Sn 70 && exec {} -np 8 /bin/sh -c 'ulimit -Sn'", lr)},
      kLimit);
  INFO(describe(raised) << "\n" << raised.output);
  CHECK(raised.ok());
  CHECK_THAT(raised.output, !Contains("70\n"));
  if (limit.rlim_max != RLIM_INFINITY)
    CHECK_THAT(raised.output, Contains(fmt::format("{}\n", limit.rlim_max)));
}

TEST_CASE("launcher: --bind-to core gives each rank its own CPUs; none leaves them alone",
          "[launcher]") {
  const auto mine = own_cpus();
  const auto cpus_of = [](const std::map<std::string, std::string>& line) {
    std::set<int> cpus;
    std::istringstream in(line.at("cpus"));
    std::string cpu;
    while (std::getline(in, cpu, ',')) cpus.insert(std::stoi(cpu));
    return cpus;
  };
  const int n = static_cast<int>(mine.size());

  SECTION("none (the default): every rank may run where the launcher may") {
    const auto r = launch({"-np", "2"}, {"print", "cpus"});
    REQUIRE(r.ok());
    const auto lines = probe_lines(r.output);
    REQUIRE(lines.size() == 2);
    for (const auto& [rank, line] : lines) CHECK(cpus_of(line) == mine);
  }
  SECTION("core: disjoint shares that cover the launcher's CPUs, as even as they divide") {
    const int np = std::min(n, 3);
    const auto r = launch({"-np", std::to_string(np), "--bind-to", "core"}, {"print", "cpus"});
    REQUIRE(r.ok());
    const auto lines = probe_lines(r.output);
    REQUIRE(lines.size() == static_cast<size_t>(np));
    std::set<int> all;
    for (const auto& [rank, line] : lines) {
      const auto cpus = cpus_of(line);
      INFO("rank " << rank << " cpus " << line.at("cpus"));
      CHECK(!cpus.empty());
      CHECK(cpus.size() <= static_cast<size_t>((n + np - 1) / np) * 2);  // SMT pairs at most double it
      for (int cpu : cpus) CHECK(all.insert(cpu).second);  // no CPU shared by two ranks
    }
    CHECK(all == mine);
  }
  SECTION("core with more ranks than CPUs: not bound, and said so") {
    const auto r = launch({"-np", std::to_string(n + 1), "--bind-to", "core"}, {"print", "cpus"});
    REQUIRE(r.ok());
    CHECK_THAT(r.output, Contains(fmt::format("--bind-to core: {} ranks on this node but {} CPUs; "
                                              "the ranks are not bound", n + 1, n)));
    for (const auto& [rank, line] : probe_lines(r.output)) CHECK(cpus_of(line) == mine);
  }
}

TEST_CASE("launcher: the program's own options are passed through", "[launcher]") {
  // Options after the program (and after --) are the program's, not the launcher's.
  const auto r = launch({"-np", "1", "--"}, {"print", "-np", "--tag-output"});
  CHECK(r.ok());
  CHECK_THAT(r.output, Contains("rank=0 world=1"));
  CHECK_THAT(r.output, !Contains("[rank 0]"));
}

TEST_CASE("launcher: two nodes in two network namespaces", "[launcher]") {
  LOCKSTEP_SKIP_UNLESS_BACKEND("gloo");
  // One launcher per namespace; the ranks meet through node 0's store and then
  // run every gloo collective across the veth link (collective_worker checks
  // the results exactly).
  const auto script = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/launcher/two_node_test.sh";
  const auto r = run_process(
      {"/bin/bash", script,
       fmt::format("{} --nnodes 2 --node-rank $NODE_RANK --nproc-per-node 1 --master-addr "
                   "$NODE0_ADDR --master-port 29500 --tag-output -- {} --backend gloo",
                   bin_path("lockstep-run"), bin_path("collective_worker"))},
      120s);
  INFO(describe(r) << "\n" << r.output);
  if (lockstep::testing::script_skipped(r)) return;
  CHECK(r.ok());
  CHECK_THAT(r.output, Contains("collective_worker rank 0/2: OK") &&
                           Contains("collective_worker rank 1/2: OK"));
}
