// lockstep-run --max-restarts: the whole group started again after a
// failure, on one node and across two; the job id every attempt shares; and
// the end of a job whose store is lost.
#include <catch2/catch.hpp>

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "launcher/launch_probe.h"

using lockstep::testing::bin_path;
using lockstep::testing::check_no_orphans;
using lockstep::testing::describe;
using lockstep::testing::run_process;
using lockstep::testing::launch;
using Catch::Matchers::Contains;
using lockstep::testing::TempDir;
using lockstep::testing::two_local_nodes;
using namespace std::chrono_literals;

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

TEST_CASE("launcher: the store holds the keys of the current attempt only, however many "
          "restarts came before",
          "[launcher][restart]") {
  // Each attempt's ranks write their rank claims, placements and backend
  // rendezvous; before, every attempt's stayed in node 0's store for the
  // whole job (20 keys more per restart here, a few per rank per restart in
  // a job of thousands). Rank 0 counts them once its group has formed, then
  // fails; rank 1 waits to be stopped, so nothing else writes meanwhile.
  const std::regex line(R"(store-keys restart=(\d+) keys=(\d+))");
  const auto counts = [&](const std::string& output) {
    std::vector<std::string> found(4);
    for (std::sregex_iterator it(output.begin(), output.end(), line), end; it != end; ++it)
      found.at(std::stoul((*it)[1].str())) = (*it)[2].str();
    return found;
  };
  const auto r = launch(
      {"-np", "2", "--max-restarts", "3", "--restart-backoff", "0", "--postmortem-dir", ""},
      {"group-sum", "store-keys=0", "fail-attempts=0:4", "sleep"}, {}, 60s);
  CHECK(r.exit_code == 7);
  CHECK_THAT(r.output, Contains("giving up"));
  const auto one_node = counts(r.output);
  INFO(r.output);
  REQUIRE_FALSE(one_node[0].empty());
  for (size_t attempt = 1; attempt < one_node.size(); ++attempt)
    CHECK(one_node[attempt] == one_node[0]);

  // Across two nodes the launchers' own keys of an attempt (its failure, the
  // nodes' stops and post-mortem parts) go too, one attempt later: from the
  // second attempt on, every attempt sees the same count.
  // (Their command lines pass through bash: '' is the empty directory.)
  const auto two = two_local_nodes({"--max-restarts", "3", "--restart-backoff", "0",
                                    "--postmortem-dir", "''"},
                                   {"group-sum", "store-keys=0", "fail-attempts=0:4", "sleep"},
                                   {"group-sum", "sleep"});
  CHECK_THAT(two.output, Contains("giving up"));
  const auto two_nodes = counts(two.output);
  REQUIRE_FALSE(two_nodes[1].empty());
  for (size_t attempt = 2; attempt < two_nodes.size(); ++attempt)
    CHECK(two_nodes[attempt] == two_nodes[1]);
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

TEST_CASE(
    "launcher: every attempt's ranks get torchrun's node and role variables and restart count",
    "[launcher][restart]") {
  // A script written for torchrun resumes from its checkpoint when
  // TORCHELASTIC_RESTART_COUNT is not 0, and reads its node as GROUP_RANK.
  // An outer torchrun's run id and agent store are not this launch's.
  const auto r = launch({"-np", "2", "--max-restarts", "2", "--restart-backoff", "0"},
                        {"print", "show=TORCHELASTIC_RESTART_COUNT", "show=LOCKSTEP_RESTART_COUNT",
                         "show=TORCHELASTIC_MAX_RESTARTS", "show=GROUP_RANK",
                         "show=GROUP_WORLD_SIZE", "show=ROLE_NAME", "show=ROLE_RANK",
                         "show=ROLE_WORLD_SIZE", "show=TORCHELASTIC_USE_AGENT_STORE",
                         "show=TORCHELASTIC_RUN_ID", "fail-attempts=1:1"},
                        {"TORCHELASTIC_RUN_ID=outer", "TORCHELASTIC_USE_AGENT_STORE=True"});
  CHECK(r.exit_code == 0);
  int restarted = 0;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) {
    const auto kv = lockstep::testing::probe_lines(line);
    if (kv.empty()) continue;
    const auto& [rank, v] = *kv.begin();
    INFO(line);
    CHECK(v.at("TORCHELASTIC_RESTART_COUNT") == v.at("LOCKSTEP_RESTART_COUNT"));
    if (v.at("LOCKSTEP_RESTART_COUNT") == "1") ++restarted;
    CHECK(v.at("TORCHELASTIC_MAX_RESTARTS") == "2");
    CHECK(v.at("GROUP_RANK") == "0");
    CHECK(v.at("GROUP_WORLD_SIZE") == "1");
    CHECK(v.at("ROLE_NAME") == "default");
    CHECK(v.at("ROLE_RANK") == std::to_string(rank));
    CHECK(v.at("ROLE_WORLD_SIZE") == "2");
    CHECK(v.at("TORCHELASTIC_USE_AGENT_STORE") == "False");
    CHECK(v.at("TORCHELASTIC_RUN_ID") == "(unset)");
  }
  CHECK(restarted == 2);

  // Several nodes: each rank's own node.
  const auto nodes = two_local_nodes({}, {"print", "show=GROUP_RANK", "show=GROUP_WORLD_SIZE"},
                                     {"print", "show=GROUP_RANK", "show=GROUP_WORLD_SIZE"});
  CHECK(nodes.ok());
  const auto lines = lockstep::testing::probe_lines(nodes.output);
  CHECK(lines.size() == 2);
  for (const auto& [rank, v] : lines) {
    CHECK(v.at("GROUP_RANK") == v.at("node"));
    CHECK(v.at("GROUP_WORLD_SIZE") == "2");
  }

  // They are the launcher's to set, as torchrun's RANK is.
  const auto refused = launch({"-np", "1", "-x", "TORCHELASTIC_RESTART_COUNT=1"}, {});
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.output, Contains("lockstep-run sets TORCHELASTIC_RESTART_COUNT"));
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

TEST_CASE("launcher: a signal while the ranks stop after a failure kills them and is not "
          "restarted",
          "[launcher][restart]") {
  // Rank 1 fails; rank 0 ignores the SIGTERM that stops it, so the launcher
  // is still in the grace period when it gets its own SIGTERM: the user's
  // stop, which used to read as a second signal and be restarted anyway.
  const std::string script = fmt::format(
      "{} -np 2 --max-restarts 1 --grace-period 30 --postmortem-dir '' {} ignore-term "
      "wait-ms=1000 exit=1:3 sleep & p=$!; sleep 3; kill -TERM $p; wait $p; echo \"exit $?\"",
      bin_path("lockstep-run"), bin_path("launcher_probe"));
  const auto r = run_process({"/bin/bash", "-c", script}, 60s);
  INFO(describe(r) << "\n" << r.output);
  CHECK(!r.timed_out);
  CHECK_THAT(r.output, Contains("exited with code 3; stopping the other 1 rank") &&
                           Contains("received SIGTERM while the ranks stop; killing them now") &&
                           Contains("received SIGTERM while the ranks stopped; not restarting") &&
                           Contains("exit 3") && !Contains("restart 1 of 1") &&
                           !Contains("did not stop within 30 s"));
}

namespace {

// Two local nodes, each launcher given `options` and its node's probe
// arguments; node 1's launcher gets SIGTERM once its output says `when`
// (`then_sleep` seconds later). Prints node 1's exit status, node 0's, then
// their output.
lockstep::testing::ProcessResult sigterm_to_node1(const std::string& options,
                                                  const std::string& probe0,
                                                  const std::string& probe1,
                                                  const std::string& when, int then_sleep = 0) {
  const int port = lockstep::testing::unused_tcp_port();
  std::string script = "export LOCKSTEP_TOKEN=t; dir=$(mktemp -d); ";
  for (int node = 0; node < 2; ++node) {
    script += fmt::format(
        "{} --nnodes 2 --node-rank {} --nproc-per-node 1 --master-addr 127.0.0.1 "
        "--master-port {} --postmortem-dir '' {} {} {} > $dir/{} 2>&1 & n{}=$!; ",
        bin_path("lockstep-run"), node, port, options, bin_path("launcher_probe"),
        node == 0 ? probe0 : probe1, node, node);
  }
  script += fmt::format(
      "for i in $(seq 200); do grep -q '{}' $dir/1 && break; sleep 0.1; done; sleep {}; "
      "kill -TERM $n1; wait $n1; echo \"node 1 exit $?\"; wait $n0; echo \"node 0 exit $?\"; "
      "cat $dir/0 $dir/1; rm -rf $dir",
      when, then_sleep);
  return run_process({"/bin/bash", "-c", script}, 60s);
}

}  // namespace

TEST_CASE("launcher: a node signalled while waiting to restart tells the other nodes, which "
          "stop at once",
          "[launcher][restart]") {
  // Both nodes agreed to restart; node 1's launcher gets SIGTERM during the
  // backoff. Node 0 used to start its ranks again and wait for node 1's
  // launcher to fall silent, then call it killed or its host down.
  const auto r = sigterm_to_node1("--max-restarts 1 --restart-backoff 2 --grace-period 30",
                                  "group-sum busy-sleep-ms=40000", "group-sum exit=1:3",
                                  "restart 1 of 1");
  INFO(describe(r) << "\n" << r.output);
  CHECK(!r.timed_out);
  CHECK_THAT(r.output,
             Contains("node 1 exit 143") && Contains("node 0 exit 1") &&
                 Contains("received SIGTERM while waiting to restart; not restarting") &&
                 Contains("lockstep-run: node 1: node 1's launcher received SIGTERM while waiting "
                          "to restart; stopping the 1 rank on node 0") &&
                 !Contains("has not been heard from"));
  // Nor does node 0's post-mortem wait for node 1's part, which the grace
  // period plus 3 s (33 s here) would bound: node 1 says its ranks were not
  // started again.
  CHECK(r.seconds < 25);
}

TEST_CASE("launcher: a node signalled after its ranks finished stops the job; no node restarts",
          "[launcher][restart]") {
  // Node 1's rank finishes at once; under --max-restarts its launcher waits
  // to learn whether every node's did, and gets SIGTERM there. It used to
  // tell the others of a failure: node 0 stopped its ranks, waited the grace
  // period plus 3 s for node 1's part of the post-mortem and 90 s more for
  // node 1 to restart with it, then called node 1's launcher gone.
  const auto r = sigterm_to_node1("--max-restarts 1 --grace-period 30",
                                  "group-sum busy-sleep-ms=40000", "group-sum",
                                  "group-sum rank=1", /*then_sleep=*/1);
  INFO(describe(r) << "\n" << r.output);
  CHECK(!r.timed_out);
  CHECK_THAT(r.output,
             Contains("node 1 exit 143") && Contains("node 0 exit 1") &&
                 Contains("lockstep-run: not restarting: node 1: node 1's launcher received "
                          "SIGTERM while waiting for the other nodes") &&
                 !Contains("cannot restart"));
  // Node 0's post-mortem has node 1's records: its rank finished, not behind.
  CHECK_THAT(r.output, Contains("every rank finished") && !Contains("is behind"));
  CHECK(r.seconds < 25);
}

TEST_CASE("launcher: a rank that cannot be executed exits 126, one that is not there 127",
          "[launcher]") {
  // The program was there at the start and changed before the restart:
  // every exec failure exited 127, "not found" to a shell or mpirun user,
  // also when the program was there but no longer executable.
  TempDir dir;
  const std::vector<std::pair<std::string, int>> cases = {
      {"chmod -x \"$0\"", 126}, {"rm \"$0\"", 127}, {"rm \"$0\" && mkdir \"$0\"", 126}};
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string script = dir.str() + fmt::format("/rank{}", i);
    std::ofstream(script) << fmt::format(
        "#!/bin/sh\n[ \"$LOCKSTEP_RESTART_COUNT$RANK\" = 00 ] && {}\nexit 1\n", cases[i].first);
    std::filesystem::permissions(script, std::filesystem::perms::owner_all);
    const auto r = run_process({bin_path("lockstep-run"), "-np", "1", "--max-restarts", "1",
                                "--restart-backoff", "0", script},
                               60s);
    INFO(cases[i].first << ": " << describe(r) << "\n" << r.output);
    CHECK(r.exit_code == cases[i].second);
    CHECK_THAT(r.output, Contains(fmt::format("exited with code {}", cases[i].second)) &&
                             Contains("lockstep-run: cannot execute " + script + ": "));
  }
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

TEST_CASE("launcher: losing another node's launcher ends node 0's within seconds, naming it",
          "[launcher][restart]") {
  // Node 1's launcher is killed (its rank dies with it) once both ranks
  // joined. Node 0's launcher must not wait for it: not for its report of
  // ranks stopped before a restart (60 s), not for it to finish (5 min), and
  // not while node 0's ranks compute and do not see the loss themselves.
  // Node 0 calls node 1 lost after --node-timeout (3 s here, 10 by default).
  const std::vector<std::string> dies = {"group-sum", "kill-parent=1:9", "sleep"};
  const auto restart =
      two_local_nodes({"--max-restarts", "1", "--postmortem-dir", "''", "--node-timeout", "3"},
                      {"group-sum", "wait-ms=500", "then-allreduce"}, dies);
  CHECK(!restart.timed_out);
  CHECK_THAT(restart.output, Contains("cannot restart: the job cannot restart as a whole: "
                                      "node 1's launcher (host ") &&
                                 Contains("has not been heard from for") &&
                                 Contains("s (--node-timeout 3): it was killed") &&
                                 !Contains("is not used") &&
                                 !Contains("did not report their ranks stopped"));

  // Node 0's ranks succeeded, but the job did not on node 1: node 0 says so.
  const auto finished = two_local_nodes({"--node-timeout", "3"}, {"group-sum"}, dies);
  CHECK(!finished.timed_out);
  CHECK_THAT(finished.output, Contains("lockstep-run: node 1's launcher (host ") &&
                                  Contains("node 0's ranks had finished") &&
                                  Contains("node 0 exit 1"));

  const auto computing = two_local_nodes({"--postmortem-dir", "''", "--node-timeout", "3"},
                                         {"group-sum", "busy-sleep-ms=50000"}, dies);
  CHECK(!computing.timed_out);
  CHECK_THAT(computing.output,
             Contains("node 0: node 1's launcher (host ") &&
                 Contains("stopping the 1 rank on node 0") && Contains("node 0 exit 1"));
}

TEST_CASE("launcher: a node whose rank fails after node 0's ranks finished fails node 0's "
          "launcher too",
          "[launcher][restart]") {
  // Node 0's rank ends at once after the group's sum; node 1's fails 3 s
  // later, while node 0's launcher keeps the store up for it. Node 0's exit
  // status is the job's: it must not say 0.
  const auto r = two_local_nodes({"--postmortem-dir", "''"}, {"group-sum"},
                                 {"group-sum", "wait-ms=3000", "exit=1:3"});
  CHECK(!r.timed_out);
  CHECK_THAT(r.output, Contains("group-sum rank=0 restart=0 sum=3 ok") &&
                           Contains("lockstep-run: node 1: rank 1 (local rank 0 on node 1") &&
                           Contains("node 0 exit 1") && Contains("node 1 exit 3"));
}

namespace {

// Two local nodes, each launcher given `options` and its node's probe
// arguments; node 0's launcher is stopped (SIGSTOP) once both ranks joined:
// its store keeps its connections but answers nothing, as when its host goes
// down without a word. Then bash runs `then` (node 1's launcher is $n1).
// Prints node 1's exit status, then its output.
lockstep::testing::ProcessResult with_node0_stopped(const std::string& options,
                                                    const std::vector<std::string>& probe,
                                                    const std::string& then = "") {
  const int port = lockstep::testing::unused_tcp_port();
  std::string script = "export LOCKSTEP_TOKEN=silent-node; dir=$(mktemp -d); ";
  for (int node = 0; node < 2; ++node) {
    script += fmt::format(
        "{} --nnodes 2 --node-rank {} --nproc-per-node 1 --master-addr 127.0.0.1 "
        "--master-port {} --postmortem-dir '' {} {} {} > $dir/{} 2>&1 & n{}=$!; ",
        bin_path("lockstep-run"), node, port, options, bin_path("launcher_probe"),
        probe.at(static_cast<size_t>(node)), node, node);
  }
  script +=
      "for i in $(seq 200); do grep -q 'group-sum rank=1' $dir/1 && break; sleep 0.1; done; "
      "kill -STOP $n0; " +
      then +
      "wait $n1; echo \"node 1 exit $?\"; kill -CONT $n0; kill -TERM $n0; wait $n0; cat $dir/1; "
      "rm -rf $dir";
  return run_process({"/bin/bash", "-c", script}, 60s);
}

}  // namespace

TEST_CASE("launcher: a node 0 that stops answering (its host down) ends the other nodes' "
          "launchers within seconds",
          "[launcher][restart]") {
  // Node 1's launcher must not wait on the stopped node 0 for good: it gives
  // node 0 the --node-timeout node 0 gives it.
  const auto r = with_node0_stopped(
      "--node-timeout 3", {"group-sum busy-sleep-ms=40000", "group-sum busy-sleep-ms=40000"});
  INFO(describe(r) << "\n" << r.output);
  CHECK(!r.timed_out);
  CHECK_THAT(r.output, Contains("group-sum rank=1 restart=0 sum=3 ok") &&
                           Contains("node 1 exit 1") &&
                           Contains("lost the job's store: node 0's launcher has not "
                                    "answered for ") &&
                           Contains(" s (--node-timeout 3; its host down or cut off"));
}

TEST_CASE("launcher: a node whose rank fails while node 0 answers nothing ends within its "
          "--node-timeout, not the store's minutes",
          "[launcher][restart]") {
  // Node 1's rank fails once node 0's launcher is stopped. Telling node 0
  // (and agreeing to restart through its store) gets no answer: node 1's
  // launcher gives up after --node-timeout and exits with its rank's code,
  // instead of waiting minutes, deaf to SIGTERM, in the store call.
  const auto r = with_node0_stopped(
      "--node-timeout 3 --max-restarts 1",
      {"group-sum busy-sleep-ms=40000", "group-sum wait-ms=2000 exit=1:3"});
  INFO(describe(r) << "\n" << r.output);
  CHECK(!r.timed_out);
  CHECK_THAT(r.output, Contains("node 1 exit 3") &&
                           Contains("could not tell the other nodes: node 0's launcher does "
                                    "not answer at 127.0.0.1:") &&
                           Contains("cannot restart: the job's store is gone (lost the job's "
                                    "store: node 0's launcher has not answered for"));
}

TEST_CASE("launcher: SIGTERM to a node whose node 0 answers nothing stops it within seconds, "
          "whatever --node-timeout says",
          "[launcher][restart]") {
  // A --node-timeout of 10 minutes bounds how long node 1 waits for node 0's
  // answer, not how long it takes to obey a signal: its ranks stop at once,
  // and it gives node 0 a moment to take the news.
  const auto r = with_node0_stopped(
      "--node-timeout 600", {"group-sum busy-sleep-ms=40000", "group-sum busy-sleep-ms=40000"},
      "sleep 1; kill -TERM $n1; ");
  INFO(describe(r) << "\n" << r.output);
  CHECK(!r.timed_out);
  CHECK_THAT(r.output, Contains("node 1 exit 143") &&
                           Contains("received SIGTERM; forwarding it to 1 rank") &&
                           Contains("could not tell the other nodes to stop: node 0's launcher "
                                    "does not answer at 127.0.0.1:"));
}

TEST_CASE("launcher: SIGTERM while a node tells a silent node 0 of its rank's failure ends that "
          "wait, and the job is not restarted",
          "[launcher][restart]") {
  // Node 1's rank fails; its launcher waits for node 0's answer (for up to
  // --node-timeout) when the SIGTERM comes. The wait ends then; the signal,
  // coming while the ranks stop, is the user's: no restart.
  const auto r = with_node0_stopped(
      "--node-timeout 600 --max-restarts 1",
      {"group-sum busy-sleep-ms=40000", "group-sum wait-ms=1000 exit=1:3"},
      "sleep 5; kill -TERM $n1; ");
  INFO(describe(r) << "\n" << r.output);
  CHECK(!r.timed_out);
  CHECK_THAT(r.output,
             Contains("node 1 exit 3") &&
                 Contains("stopped waiting for the answer to compare_set('lockstep-run/failure') "
                          "(received SIGTERM)") &&
                 Contains("received SIGTERM while the ranks stopped; not restarting") &&
                 !Contains("restart 1 of 1"));
}
