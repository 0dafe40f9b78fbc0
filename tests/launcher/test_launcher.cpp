// lockstep-run end to end: each test starts the real launcher with the
// launcher_probe worker (tests/workers/launcher_probe.cpp) under a time limit.
#include <catch2/catch.hpp>

#include <fcntl.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "lockstep/config.h"
#include "lockstep/distributed/wire_protocol.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "support/backend_skip.h"
#include "launcher/launch_probe.h"

using lockstep::testing::bin_path;
using lockstep::testing::check_no_orphans;
using lockstep::testing::describe;
using lockstep::testing::kLimit;
using lockstep::testing::launch;
using lockstep::testing::probe_lines;
using lockstep::testing::run_process;
using Catch::Matchers::Contains;
using lockstep::testing::TempDir;
using namespace std::chrono_literals;

TEST_CASE("launcher: ranks get their variables", "[launcher]") {
  const int n = GENERATE(2, 4);
  INFO("-np " << n);
  const auto r = launch({"-np", std::to_string(n)},
                        {"print", "show=LOCKSTEP_STORE_ADDR", "show=LOCKSTEP_TOKEN",
                         "show=RANK", "show=WORLD_SIZE", "show=LOCAL_RANK", "show=LOCAL_WORLD_SIZE",
                         "show=MASTER_ADDR", "show=MASTER_PORT", "show=OMP_NUM_THREADS",
                         "show=LOCKSTEP_NUM_NODES"},
                        {"OMP_NUM_THREADS"});  // the default, not the user's shell's
  REQUIRE(r.ok());
  const auto lines = probe_lines(r.output);
  REQUIRE(lines.size() == static_cast<size_t>(n));
  std::set<std::string> addrs, tokens, master_ports;
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
    // MASTER_PORT is left free for a torchrun program's own store, beside
    // lockstep's on the same host.
    CHECK(std::regex_match(kv.at("LOCKSTEP_STORE_ADDR"), std::regex(R"(127\.0\.0\.1:[1-9][0-9]*)")));
    CHECK(kv.at("MASTER_ADDR") == "127.0.0.1");
    CHECK(std::regex_match(kv.at("MASTER_PORT"), std::regex("[1-9][0-9]*")));
    CHECK(kv.at("LOCKSTEP_STORE_ADDR") != kv.at("MASTER_ADDR") + ":" + kv.at("MASTER_PORT"));
    CHECK(std::regex_match(kv.at("LOCKSTEP_TOKEN"), std::regex("[0-9a-f]{32}")));
    addrs.insert(kv.at("LOCKSTEP_STORE_ADDR"));
    master_ports.insert(kv.at("MASTER_PORT"));
    tokens.insert(kv.at("LOCKSTEP_TOKEN"));
  }
  CHECK(addrs.size() == 1);
  CHECK(tokens.size() == 1);
  CHECK(master_ports.size() == 1);
}

TEST_CASE("launcher: a rank of another wire protocol than the launcher's refuses to start, "
          "naming both builds",
          "[launcher][wire_protocol]") {
  // Each rank is told the launcher's protocol and version.
  const auto r = launch({"-np", "1"},
                        {"print", "show=LOCKSTEP_LAUNCHER_WIRE", "show=LOCKSTEP_LAUNCHER_VERSION"});
  REQUIRE(r.ok());
  const auto lines = probe_lines(r.output);
  REQUIRE(lines.size() == 1);
  CHECK(lines.at(0).at("LOCKSTEP_LAUNCHER_WIRE") ==
        std::to_string(lockstep::distributed::kWireProtocol));
  CHECK(lines.at(0).at("LOCKSTEP_LAUNCHER_VERSION") == LOCKSTEP_VERSION_STRING);

  // A program whose build speaks another protocol than its lockstep-run,
  // played by one that sees another launcher's values. Before, it read the
  // launcher's variables as its own and went on.
  const auto other = run_process({bin_path("lockstep-run"), "-np", "2", "/usr/bin/env",
                                  "LOCKSTEP_LAUNCHER_WIRE=0", "LOCKSTEP_LAUNCHER_VERSION=0.0.1",
                                  bin_path("launcher_probe"), "print"},
                                 kLimit);
  INFO(describe(other) << "\n" << other.output);
  CHECK(other.exit_code != 0);
  CHECK_THAT(other.output, Contains(fmt::format("this program runs lockstep {} wire {}, but the "
                                                "lockstep-run that started it runs lockstep "
                                                "0.0.1 wire 0",
                                                LOCKSTEP_VERSION_STRING,
                                                lockstep::distributed::kWireProtocol)));
  CHECK(probe_lines(other.output).empty());
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

TEST_CASE("launcher: --tag-output: told to stop, the launcher gives a reader that takes nothing "
          "the grace period",
          "[launcher]") {
  // Rank 0 prints more than the pipes and the launcher's queue hold to a
  // reader that never reads (sleep holding a fifo open), so its writes block.
  // SIGTERM ends the rank; the launcher then waited for that reader until it
  // went away, 30 s here, for good with a paused pager.
  TempDir dir;
  const std::string script = fmt::format(
      "mkfifo {0}/out; sleep 30 < {0}/out > /dev/null & reader=$!; "
      "{1} -np 1 --tag-output --grace-period 1 {2} print-lines=0:1000000 > {0}/out 2> {0}/err & "
      "n=$!; sleep 2; kill -TERM $n; wait $n; echo \"launcher exit $?\"; kill $reader; "
      "cat {0}/err",
      dir.str(), bin_path("lockstep-run"), bin_path("launcher_probe"));
  const auto r = run_process({"/bin/bash", "-c", script}, 60s);
  INFO(describe(r) << "\n" << r.output);
  CHECK(r.seconds < 20);
  CHECK_THAT(r.output, Contains("launcher exit 143") &&
                           Contains("received SIGTERM; forwarding it to 1 rank") &&
                           Contains("nothing of the ranks' output was read for 1 s after SIGTERM; "
                                    "dropping the "));
}

TEST_CASE("launcher: --tag-output: ranks writing to a reader that has gone end with SIGPIPE",
          "[launcher]") {
  // `| head -1` reads one line and exits; ranks that print without end
  // must meet SIGPIPE as without --tag-output, not run on unseen for good.
  const std::string script = fmt::format(
      "{} -np 2 --tag-output yes | head -1; echo \"launcher exit ${{PIPESTATUS[0]}}\"",
      bin_path("lockstep-run"));
  const auto r = run_process({"/bin/bash", "-c", script}, 10s);
  INFO(describe(r) << "\n" << r.output);
  CHECK(!r.timed_out);
  CHECK_THAT(r.output, Contains("] y\n") && Contains("killed by SIGPIPE") &&
                           Contains("launcher exit 141"));
}

TEST_CASE("launcher: --tag-output leaves its stdout's flags alone, even killed with SIGKILL",
          "[launcher]") {
  // The stdout pipe is shared with the shell's next commands: the launcher
  // used to make it non-blocking, and a SIGKILL left it so, failing their
  // writes with EAGAIN ("Resource temporarily unavailable").
  const std::string script = fmt::format(
      "{{ {} --tag-output -np 1 sleep 10 & pid=$!; sleep 2; kill -9 $pid; wait $pid; "
      "awk '/^flags/ {{ print \"flags \" $2 }}' /proc/self/fdinfo/1; }} | cat",
      bin_path("lockstep-run"));
  const auto r = run_process({"/bin/bash", "-c", script}, 10s);
  INFO(describe(r) << "\n" << r.output);
  const auto at = r.output.find("flags ");
  REQUIRE(at != std::string::npos);
  const long flags = std::stol(r.output.substr(at + 6), nullptr, 8);
  CHECK((flags & O_NONBLOCK) == 0);
}

TEST_CASE("launcher: started with its stdout closed, the job runs as with it open",
          "[launcher]") {
  // The store's socket used to take descriptor 1: --tag-output wrote the
  // ranks' lines into it (on node 1, into its store connection), and now
  // that a gone reader ends the ranks, they died of SIGPIPE.
  const auto r = run_process(
      {"/bin/sh", "-c",
       fmt::format("exec {} -np 2 --tag-output {} print >&-", bin_path("lockstep-run"),
                   bin_path("launcher_probe"))},
      10s);
  INFO(describe(r) << "\n" << r.output);
  CHECK(r.ok());
  CHECK_THAT(r.output, !Contains("SIGPIPE"));
}

TEST_CASE("launcher: --tag-output shows a failed rank's last words before saying it failed",
          "[launcher]") {
  // The launcher used to handle the rank's exit before reading what it had
  // written just before: its error came after "rank 0 ... exited with code 3".
  const std::string script = fmt::format(
      "exec {} -np 2 --tag-output /bin/sh -c "
      "'if [ $RANK = 0 ]; then echo fatal: boom >&2; printf unended >&2; exit 3; fi; "
      "exec sleep 5' 2>&1",
      bin_path("lockstep-run"));
  for (int run = 0; run < 3; ++run) {
    const auto r = run_process({"/bin/sh", "-c", script}, 10s);
    INFO(describe(r) << "\n" << r.output);
    CHECK(r.exit_code == 3);
    const auto said = r.output.find("lockstep-run: rank 0");
    REQUIRE(said != std::string::npos);
    CHECK(r.output.find("[rank 0] fatal: boom\n[rank 0] unended\n") < said);
  }
}

TEST_CASE("launcher: --tag-output keeps a rank's stdout and stderr lines in order when they go "
          "to one file",
          "[launcher]") {
  // With 2>&1 each line comes out where it would without --tag-output; the
  // two pipes read in turn used to put a batch of stderr lines before the
  // stdout lines written first.
  const std::string script = fmt::format(
      "exec {} -np 1 --tag-output /bin/sh -c "
      "'for i in 1 2 3 4 5 6 7 8 9; do echo out$i; echo err$i >&2; done' 2>&1",
      bin_path("lockstep-run"));
  std::string expected;
  for (int i = 1; i <= 9; ++i) expected += fmt::format("[rank 0] out{0}\n[rank 0] err{0}\n", i);
  const auto r = run_process({"/bin/sh", "-c", script}, 10s);
  INFO(describe(r));
  CHECK(r.ok());
  CHECK(r.output == expected);
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

// A rank that returns 0 before init_process_group (an early `return` for all
// but rank 0, say): the others waited for it the whole timeout (10 minutes by
// default), where a failure would have ended the job at once.
TEST_CASE("launcher: a rank that exits 0 before joining its group is named by the ranks waiting "
          "for it within seconds, after a restart too",
          "[launcher]") {
  const auto r = launch({"-np", "3"}, {"leave-early=1", "group-sum"});
  CHECK(r.exit_code != 0);
  CHECK_FALSE(r.timed_out);
  CHECK(r.seconds < 10);
  CHECK_THAT(r.output, Contains("waited for every rank's backend, node and device, but rank 1 "
                                "exited with code 0 without joining the group"));
  // Each attempt's ranks read their own attempt's records.
  const auto again = launch({"-np", "2", "--max-restarts", "1", "--restart-backoff", "0"},
                            {"leave-early=0", "group-sum"});
  CHECK(again.exit_code != 0);
  CHECK(again.seconds < 15);
  CHECK_THAT(again.output, Contains("restart 1 of 1"));
  const std::string named = "but rank 0 exited with code 0 without joining the group";
  const size_t first = again.output.find(named);
  REQUIRE(first != std::string::npos);
  CHECK(again.output.find(named, first + 1) != std::string::npos);
}

TEST_CASE("launcher: the mpi backend outside mpirun is refused, not a one-rank world per process",
          "[launcher][mpi]") {
  // Ranks that lockstep-run starts are each an MPI world of one. Before, the
  // group took MPI's rank and size over the launcher's, so every rank was
  // "rank 0 of 1" and trained alone (all-reduces summed one rank, every rank
  // wrote rank 0's checkpoints) without a word.
  LOCKSTEP_SKIP_UNLESS_BACKEND("mpi");
  const auto r = launch({"-np", "2"}, {"group-sum"}, {"LOCKSTEP_BACKEND=mpi"});
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.output, Contains("but MPI_COMM_WORLD says rank 0 of 1") &&
                           Contains("Start the program with mpirun -np 2") &&
                           !Contains("group-sum rank="));
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
      // Read as 0 ms: hang detection off without a word.
      {{lr, "-np", "2", "--hang-timeout", "0.0001", "true"},
       "--hang-timeout 0.0001 is too short to tell a hung rank from a busy one"},
      {{lr, "-np", "2", "--node-timeout", "0.5", "true"},
       "--node-timeout 0.5 is too short to tell a lost node from a slow one"},
      {{lr, "-np", "2", "--node-timeout", "nan", "true"}, "--node-timeout nan must be a number"},
      {{lr, "-np", "2", "--grace-period", "1e300", "true"}, "--grace-period 1e+300 must be"},
      {{lr, "-np", "2", "--restart-backoff", "inf", "true"}, "--restart-backoff inf must be"},
      // CLI11 read 0x as hex: 2 ranks.
      {{lr, "-np", "0x2", "true"}, "--np: '0x2' is not a whole number"},
      {{lr, "-np", "2", "--master-port", "1e3", "true"}, "'1e3' is not a whole number"},
      // Every rank used to abort at start-up (exit 134) on a name that does not resolve.
      {{lr, "-np", "2", "--master-addr", "nosuchhost.invalid", "true"},
       "--master-addr nosuchhost.invalid: not an address or a host name that resolves"},
      // The job ran, and once a rank failed its post-mortem's JSON could not be written.
      {{lr, "-np", "2", "--postmortem-dir", "/no/such/dir", "true"},
       "--postmortem-dir /no/such/dir: No such file or directory; give a directory"},
      {{lr, "-np", "2", "--postmortem-dir", "/dev/null", "true"},
       "--postmortem-dir /dev/null: not a directory"},
  };
  for (const auto& c : cases) {
    const auto r = run_process(c.args, kLimit, {"LOCKSTEP_TOKEN="});
    INFO(c.args.back() << ": " << describe(r) << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Contains(c.message));
  }

  // A program in the current directory, or one that is not executable: the
  // message says what to do instead of only "not found".
  TempDir dir;
  std::ofstream(dir.file("script.sh")) << "#!/bin/sh\nexit 0\n";
  std::ofstream(dir.file("tool")) << "#!/bin/sh\nexit 0\n";
  std::filesystem::permissions(dir.file("tool"), std::filesystem::perms::owner_exec,
                               std::filesystem::perm_options::add);
  const std::vector<std::pair<std::string, std::string>> here = {
      {"tool", "'tool' not found in PATH; ./tool is here: start it as ./tool"},
      {"script.sh", "./script.sh is here, but it is not executable (chmod +x it)"},
      {"./script.sh", "'./script.sh' is not executable (chmod +x it)"},
      {"./no-such", "'./no-such' not found"}};
  for (const auto& [program, message] : here) {
    const auto r = run_process(
        {"/bin/sh", "-c", "cd \"$0\" && exec \"$1\" -np 1 \"$2\"", dir.str(), lr, program},
        kLimit);
    INFO(program << ": " << describe(r) << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Contains(message));
  }

  const auto help = run_process({lr, "--help"}, kLimit);
  CHECK(help.exit_code == 0);
  for (const char* option : {"-np", "--nproc-per-node", "--nnodes", "--node-rank",
                             "--master-addr", "--master-port", "--token", "-x", "--tag-output",
                             "--grace-period", "--bind-to", "--max-restarts",
                             "--restart-backoff", "--hang-timeout", "--node-timeout"})
    CHECK_THAT(help.output, Contains(option));
  // Every variable each rank gets (README.md); the heartbeat's were missing.
  for (const char* var : {"LOCKSTEP_RANK", "LOCKSTEP_STORE_ADDR", "MASTER_PORT",
                          "LOCKSTEP_RESTART_COUNT", "LOCKSTEP_JOB_ID", "LOCKSTEP_FLIGHT_RECORDER",
                          "LOCKSTEP_HEARTBEAT_FD", "LOCKSTEP_HEARTBEAT_MS", "OMP_NUM_THREADS"})
    CHECK_THAT(help.output, Contains(var));

  // As mpirun --version: the version, exit 0, nothing started. Before, it was
  // refused as an unknown option.
  const auto version = run_process({lr, "--version"}, kLimit);
  CHECK(version.exit_code == 0);
  CHECK(version.output == fmt::format("lockstep-run {}\n", LOCKSTEP_VERSION_STRING));
  CHECK_THAT(help.output, Contains("--version"));
}

TEST_CASE("launcher: -x of a variable the launcher sets for each rank is refused, naming it",
          "[launcher]") {
  // The ranks got the launcher's value without a word: -x MASTER_PORT=29500
  // gave rank 0 another port to serve on (it now chooses that port: "-x
  // MASTER_PORT chooses ..."), -x RANK=0 gave each rank its own rank.
  const auto lr = bin_path("lockstep-run");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"RANK=0", "-x RANK=0: lockstep-run sets RANK for each rank itself, over any value -x "
                 "gives"},
      {"LOCAL_RANK=0", "-x LOCAL_RANK=0: lockstep-run sets LOCAL_RANK for each rank itself"},
      {"MASTER_ADDR=h", "to choose it, use --master-addr"},
      {"WORLD_SIZE=8", "to choose it, use -np or --nproc-per-node and --nnodes"},
      {"LOCKSTEP_STORE_ADDR=h:1", "lockstep-run sets LOCKSTEP_STORE_ADDR for each rank itself"},
      {"LOCKSTEP_JOB_ID=j", "lockstep-run sets LOCKSTEP_JOB_ID for each rank itself"},
      {"LOCKSTEP_HEARTBEAT_FD", "to choose it, use --hang-timeout"}};
  for (const auto& [spec, message] : cases) {
    const auto r = run_process({lr, "-np", "2", "-x", spec, "true"}, kLimit,
                               {"LOCKSTEP_HEARTBEAT_FD=3"});
    INFO(spec << ": " << describe(r) << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Contains(message));
  }
  // The variables the ranks read but the launcher leaves alone still pass.
  const auto ok = launch({"-np", "2", "-x", "OMP_NUM_THREADS=3", "-x", "LOCKSTEP_BACKEND=shm"},
                         {"print", "show=OMP_NUM_THREADS"});
  INFO(ok.output);
  CHECK(ok.ok());
  CHECK_THAT(ok.output, Contains("OMP_NUM_THREADS=3"));
}

TEST_CASE("launcher: a script whose #! interpreter cannot run is refused, naming the interpreter",
          "[launcher]") {
  // Every rank printed "cannot execute SCRIPT: No such file or directory", of a
  // script that is there, and exited 127.
  TempDir dir;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"#!/no/such/python3 -u\nprint(1)\n",
       "the interpreter on its #! line, '/no/such/python3', is not found"},
      {"#!/bin/sh\r\necho hi\r\n",
       "has Windows line ends: the interpreter on its #! line, '/bin/sh\\r', is not found"},
      {"#! /tmp\n", "the interpreter on its #! line, '/tmp', is a directory"}};
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string script = dir.str() + fmt::format("/script{}", i);
    std::ofstream(script) << cases[i].first;
    std::filesystem::permissions(script, std::filesystem::perms::owner_all);
    const auto r = run_process({bin_path("lockstep-run"), "-np", "2", script}, kLimit);
    INFO(describe(r) << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Contains(fmt::format("program '{}' ", script)) &&
                             Contains(cases[i].second) && !Contains("No such file"));
  }
  // An interpreter that is there, found through env: the script runs.
  const std::string ok = dir.str() + "/ok";
  std::ofstream(ok) << "#!/usr/bin/env sh\necho \"rank $RANK ran\"\n";
  std::filesystem::permissions(ok, std::filesystem::perms::owner_all);
  const auto r = run_process({bin_path("lockstep-run"), "-np", "2", ok}, kLimit);
  INFO(describe(r) << "\n" << r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("rank 0 ran") && Contains("rank 1 ran"));
}

TEST_CASE("launcher: whole numbers are decimal, leading zeros and all", "[launcher]") {
  // A count cut from a zero-padded name (node08, gpu010): CLI11 read "010" as
  // octal 8 and refused "08".
  for (const auto& [np, ranks] : {std::pair{"010", 10}, std::pair{"08", 8}}) {
    const auto r = launch({"-np", np}, {"print"});
    CHECK(r.ok());
    const auto lines = probe_lines(r.output);
    CHECK(lines.size() == static_cast<size_t>(ranks));
    for (const auto& [rank, kv] : lines) CHECK(kv.at("world") == std::to_string(ranks));
  }
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

TEST_CASE("launcher: a --master-addr that does not lead back to node 0 is refused before a rank "
          "starts", "[launcher]") {
  // 203.0.113.7 is a documentation address (RFC 5737), no host's own. The
  // ranks retried it until the hang detector killed one as deadlocked.
  const auto r = run_process({bin_path("lockstep-run"), "-np", "2", "--master-addr",
                              "203.0.113.7", bin_path("launcher_probe"), "group-sum"},
                             kLimit);
  INFO(describe(r) << "\n" << r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Contains("--master-addr 203.0.113.7: this node serves the job's store, "
                                "but its ranks could not connect to it at 203.0.113.7:") &&
                           !Contains("group-sum") && !Contains("hung"));
  // This host's own addresses still work.
  for (const std::string addr : {"127.0.0.1", "localhost"}) {
    const auto ok = run_process({bin_path("lockstep-run"), "-np", "2", "--master-addr", addr,
                                 bin_path("launcher_probe"), "group-sum"},
                                kLimit);
    INFO(addr << ": " << describe(ok) << "\n" << ok.output);
    CHECK(ok.exit_code == 0);
    CHECK_THAT(ok.output, Contains("sum=3 ok"));
  }
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

TEST_CASE("launcher: a program for another architecture, or a binary file, is an exec format "
          "error, not run by /bin/sh",
          "[launcher]") {
  // execve refuses both (ENOEXEC); /bin/sh would read their bytes as commands.
  TempDir dir;
  const std::string elf = dir.str() + "/foreign-elf";
  const std::string binary = dir.str() + "/binary";
  {
    std::ofstream out(elf, std::ios::binary);
    out << "\x7f" "ELF" << std::string(60, '\0') << "\necho ran-as-script\n";
    const char bytes[] = "ab\0cd\necho ran-as-script\n";
    std::ofstream(binary, std::ios::binary).write(bytes, sizeof bytes - 1);
  }
  for (const auto& program : {elf, binary}) {
    std::filesystem::permissions(program, std::filesystem::perms::owner_all);
    const auto r = run_process({bin_path("lockstep-run"), "-np", "2", program}, kLimit);
    INFO(r.output);
    CHECK(r.exit_code == 126);
    CHECK_THAT(r.output, Contains("cannot execute " + program + ": Exec format error") &&
                             !Contains("ran-as-script"));
  }
  // A script whose #! interpreter is such a program: the kernel refuses the
  // script (ENOEXEC) too, and /bin/sh is not its interpreter either.
  const std::string script = dir.str() + "/foreign-interpreter";
  std::ofstream(script) << "#!" << elf << "\necho ran-as-script\n";
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  const auto r = run_process({bin_path("lockstep-run"), "-np", "1", script}, kLimit);
  INFO(r.output);
  CHECK(r.exit_code == 126);
  CHECK_THAT(r.output, Contains("cannot execute " + script + ": Exec format error: the "
                                "interpreter on its #! line, '" + elf + "', is not a program") &&
                           !Contains("ran-as-script"));
}

TEST_CASE("launcher: the program's own options are passed through", "[launcher]") {
  // Options after the program (and after --) are the program's, not the launcher's.
  const auto r = launch({"-np", "1", "--"}, {"print", "-np", "--tag-output"});
  CHECK(r.ok());
  CHECK_THAT(r.output, Contains("rank=0 world=1"));
  CHECK_THAT(r.output, !Contains("[rank 0]"));
}
