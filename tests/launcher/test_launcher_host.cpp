// lockstep-run end to end on the host it runs on: the open-file limit, the
// CPUs it binds ranks to, and the network (namespaces with a loopback down,
// no free ephemeral port, two nodes' launchers that disagree). Each test starts
// the real launcher with the launcher_probe worker under a time limit.
#include <catch2/catch.hpp>

#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "support/backend_skip.h"
#include "launcher/launch_probe.h"

using lockstep::testing::bin_path;
using lockstep::testing::describe;
using lockstep::testing::kLimit;
using lockstep::testing::launch;
using lockstep::testing::probe_lines;
using lockstep::testing::run_process;
using Catch::Matchers::Contains;
using lockstep::testing::TempDir;
using namespace std::chrono_literals;

namespace {

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

}  // namespace

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

  // One rank: said in the singular, and not told to start fewer.
  const auto one = run_process(
      {"/bin/sh", "-c", fmt::format("ulimit -n 20 && exec {} -np 1 /bin/true", lr)}, kLimit);
  INFO(describe(one) << "\n" << one.output);
  CHECK(one.exit_code == 2);
  CHECK_THAT(one.output, Contains("1 rank on this node needs about") &&
                             Contains("the hard limit is 20") && !Contains("fewer ranks"));

  // A soft limit below what 30 ranks need is raised to the hard limit, which
  // the ranks inherit.
  rlimit limit{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &limit) == 0);
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < 200) {
    WARN("skipped the raise: this process's hard limit (" << limit.rlim_max << ") is below 200");
    return;
  }
  const auto raised = run_process(
      {"/bin/sh", "-c", fmt::format("ulimit -Sn 40 && exec {} -np 30 /bin/sh -c 'ulimit -Sn'", lr)},
      kLimit);
  INFO(describe(raised) << "\n" << raised.output);
  CHECK(raised.ok());
  CHECK_THAT(raised.output, !Contains("40\n"));
  if (limit.rlim_max != RLIM_INFINITY)
    CHECK_THAT(raised.output, Contains(fmt::format("{}\n", limit.rlim_max)));
}

TEST_CASE("launcher: 4 ranks start under an open-file limit of 64 (ulimit -n 64)", "[launcher]") {
  // The launcher holds a few descriptors of its own and a few per rank; it
  // used to reserve 64 for itself and refuse even one rank under this limit.
  const auto r = run_process(
      {"/bin/sh", "-c",
       fmt::format("ulimit -n 64 && exec {} -np 4 {}", bin_path("lockstep-run"),
                   bin_path("collective_worker"))},
      kLimit);
  INFO(describe(r) << "\n" << r.output);
  CHECK(r.ok());
  for (int rank = 0; rank < 4; ++rank)
    CHECK_THAT(r.output, Contains(fmt::format("collective_worker rank {}/4: OK", rank)));
}

TEST_CASE("launcher: node 0 of a several-node job runs under the open-file limit it says it needs",
          "[launcher]") {
  // Node 0 serves every other node's launcher four store connections (node
  // link and exit recorder); it used to count one, so a limit it accepted
  // ran out at the store's accept ("Too many open files") and the job
  // failed as hung ranks instead of being refused before a rank started.
  constexpr int kNodes = 6;
  const auto lr = bin_path("lockstep-run");
  const int port = lockstep::testing::unused_tcp_port();
  const auto node = [&](int n) {
    return fmt::format("{} --nnodes {} --node-rank {} --nproc-per-node 1 --master-addr 127.0.0.1 "
                       "--master-port {} {} group-sum",
                       lr, kNodes, n, port, bin_path("launcher_probe"));
  };
  const std::string token = "export LOCKSTEP_TOKEN=open-file-limit; ";
  const auto refused = run_process(
      {"/bin/sh", "-c", fmt::format("{}ulimit -n 20 && exec {}", token, node(0))}, kLimit);
  INFO(describe(refused) << "\n" << refused.output);
  REQUIRE(refused.exit_code == 2);
  std::smatch needs;
  REQUIRE(std::regex_search(refused.output, needs, std::regex(R"(needs about (\d+) open files)")));
  CHECK_THAT(refused.output, Contains("4 for each other node's launcher"));

  std::string script = token;
  for (int n = 1; n < kNodes; ++n) script += fmt::format("timeout 50 {} & ", node(n));
  script += fmt::format("(ulimit -n {} && exec timeout 50 {}); echo \"node 0 exit $?\"; wait",
                        needs[1].str(), node(0));
  const auto r = run_process({"/bin/bash", "-c", script}, 60s);
  INFO(describe(r) << "\n" << r.output);
  CHECK(r.ok());
  CHECK_THAT(r.output, Contains("node 0 exit 0") && !Contains("Too many open files"));
  for (int rank = 0; rank < kNodes; ++rank)
    CHECK_THAT(r.output, Contains(fmt::format("group-sum rank={} restart=0 sum=21 ok", rank)));
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
    CHECK_THAT(r.output, Contains(fmt::format("--bind-to core: {} ranks on this node but {} "
                                              "CPU{}; the ranks are not bound",
                                              n + 1, n, n == 1 ? "" : "s")));
    for (const auto& [rank, line] : probe_lines(r.output)) CHECK(cpus_of(line) == mine);
  }
  SECTION("core with two ranks and one CPU: said in the singular") {
    // The launcher inherits this thread's CPUs: one, for its run only.
    cpu_set_t one, all;
    CPU_ZERO(&one);
    CPU_SET(*mine.begin(), &one);
    REQUIRE(sched_getaffinity(0, sizeof all, &all) == 0);
    REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
    const auto r = launch({"-np", "2", "--bind-to", "core"}, {"print", "cpus"});
    REQUIRE(sched_setaffinity(0, sizeof all, &all) == 0);
    REQUIRE(r.ok());
    CHECK_THAT(r.output, Contains("--bind-to core: 2 ranks on this node but 1 CPU; the ranks "
                                  "are not bound"));
  }
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

TEST_CASE("launcher: in a network namespace whose loopback is down, ranks say so instead of "
          "hanging",
          "[launcher]") {
  // `unshare -n` (and a container without networking) leaves `lo` down: every
  // connect to 127.0.0.1 is "Network is unreachable", which retrying never
  // mends; the ranks waited for the store until the hang detector killed
  // them as if deadlocked.
  const std::string script = fmt::format(
      "unshare -n true 2>/dev/null || {{ echo 'SKIPPED: cannot unshare a network namespace "
      "(needs root)'; exit 0; }}; exec unshare -n {} -np 2 --postmortem-dir '' {} group-sum",
      bin_path("lockstep-run"), bin_path("launcher_probe"));
  const auto r = run_process({"/bin/sh", "-c", script}, 120s);
  INFO(describe(r) << "\n" << r.output);
  if (lockstep::testing::script_skipped(r)) return;
  CHECK_FALSE(r.ok());
  CHECK_THAT(r.output, Contains("loopback interface is down") && Contains("ip link set lo up"));
  CHECK_THAT(r.output, !Contains("is hung"));
}

TEST_CASE("launcher: a job whose flight records have nowhere to go (a read-only root file "
          "system) runs without them",
          "[launcher]") {
  // A container with a read-only root file system: the launcher refused the
  // job because it could not make its flight-record directory, which only
  // serves a failure's report. /dev/shm, TMPDIR and /tmp are made read-only
  // where they are (bind mounts, so that a build under /tmp still runs), in a
  // mount namespace of the script's own (root only); the ranks use gloo, as
  // shm's segments need a writable /dev/shm.
  LOCKSTEP_SKIP_UNLESS_BACKEND("gloo");
  TempDir dir;
  // $0: TMPDIR; $1: lockstep-run; $2: the rank program.
  const std::string read_only = R"(for d in /dev/shm "$0" /tmp; do mount --bind "$d" "$d" && mount -o remount,ro,bind "$d" || exit 1; done
TMPDIR="$0" exec "$1" -np 2 --postmortem-dir "" -x LOCKSTEP_BACKEND=gloo "$2" group-sum)";
  const std::string script = fmt::format(
      "unshare -m true 2>/dev/null || {{ echo 'SKIPPED: cannot unshare a mount namespace (needs "
      "root)'; exit 0; }}; exec unshare -m sh -c '{}' '{}' '{}' '{}'",
      read_only, dir.str(), bin_path("lockstep-run"), bin_path("launcher_probe"));
  const auto r = run_process({"/bin/sh", "-c", script}, 120s);
  INFO(describe(r) << "\n" << r.output);
  if (lockstep::testing::script_skipped(r)) return;
  CHECK(r.ok());
  CHECK_THAT(r.output, Contains("group-sum rank=0 restart=0 sum=3 ok") &&
                           Contains("group-sum rank=1 restart=0 sum=3 ok"));
  // Every place tried is named, with why.
  CHECK_THAT(r.output, Contains("flight records are off for this job") &&
                           Contains("/dev/shm: Read-only file system") &&
                           Contains(dir.str() + ": Read-only file system") &&
                           Contains("/tmp: Read-only file system") && Contains("set TMPDIR"));
}

TEST_CASE("launcher: ranks wait out a moment with no free ephemeral port instead of blaming "
          "the loopback",
          "[launcher]") {
  // With `lo` up, connect's EADDRNOTAVAIL on a loopback address means every
  // local port is taken (here, held for 2 s by another program), which
  // passes; rank 1 failed at once saying the loopback interface was down.
  // Ranks started by hand (as torchrun's env://): the launcher's own check
  // of the address would stop first.
  TempDir dir;
  std::ofstream(dir.file("hold_ports.py")) << "import socket, time\n"
                                               "held = [socket.socket() for _ in range(64)]\n"
                                               "for i, s in enumerate(held):\n"
                                               "    s.bind(('127.0.0.1', 40000 + i))\n"
                                               "open('ports-held', 'w').close()\n"
                                               "time.sleep(2)\n";
  const std::string in_namespace =
      "ip link set lo up && sysctl -qw net.ipv4.ip_local_port_range=\"40000 40063\"";
  const std::string script = fmt::format(
      "cd '{}' || exit 1; command -v python3 >/dev/null && unshare -Urn sh -c '{}' 2>/dev/null || "
      "{{ echo 'SKIPPED: needs python3 and an unprivileged network namespace'; exit 0; }}; "
      "exec unshare -Urn sh -c '{} && {{ python3 hold_ports.py & "
      "while [ ! -e ports-held ]; do sleep 0.05; done; "
      "export MASTER_ADDR=127.0.0.2 MASTER_PORT=29500 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2; "
      "RANK=1 LOCAL_RANK=1 {} group-sum & one=$!; RANK=0 LOCAL_RANK=0 {} group-sum || exit 1; "
      "wait $one; }}'",
      dir.str(), in_namespace, in_namespace, bin_path("launcher_probe"), bin_path("launcher_probe"));
  const auto r = run_process({"/bin/sh", "-c", script}, 120s);
  INFO(describe(r) << "\n" << r.output);
  if (lockstep::testing::script_skipped(r)) return;
  CHECK(r.ok());
  CHECK_THAT(r.output, !Contains("loopback interface is down"));
  CHECK_THAT(r.output, Contains("group-sum rank=0") && Contains("group-sum rank=1"));
}

TEST_CASE("launcher: a node's launcher started twice is refused and the running job goes on",
          "[launcher]") {
  // A node-1 command run again while the job runs: with the same shape, the
  // second launcher's ranks joined the job's store as a second rank 1 and
  // their failure stopped the whole job; with another (as here), its
  // complaint about the shape did.
  const int port = lockstep::testing::unused_tcp_port();
  auto node = [&](int rank, int nproc, const std::string& probe) {
    return fmt::format("{} --nnodes 2 --node-rank {} --nproc-per-node {} --master-addr 127.0.0.1 "
                       "--master-port {} --grace-period 0.5 --postmortem-dir '' {} {}",
                       bin_path("lockstep-run"), rank, nproc, port,
                       bin_path("launcher_probe"), probe);
  };
  const std::string script = fmt::format(
      "export LOCKSTEP_TOKEN=t; dir=$(mktemp -d); {} > $dir/0 2>&1 & n0=$!; "
      "{} > $dir/1 2>&1 & n1=$!; "
      "for i in $(seq 600); do grep -q 'group-sum rank=1' $dir/1 && break; sleep 0.1; done; "
      "{} > $dir/again 2>&1; echo \"again exit $?\"; "
      "kill -0 $n0 && kill -0 $n1 && echo 'the job still runs'; "
      "kill -TERM $n0 $n1; wait $n0; wait $n1; cat $dir/again $dir/0 $dir/1; rm -rf $dir",
      node(0, 1, "group-sum sleep"), node(1, 1, "group-sum sleep"), node(1, 2, "group-sum"));
  const auto r = run_process({"/bin/bash", "-c", script}, kLimit);
  INFO(describe(r) << "\n" << r.output);
  CHECK_THAT(r.output, Contains("again exit 2") && Contains("the job still runs"));
  CHECK_THAT(r.output, Contains("node 1: another launcher (host ") &&
                           Contains("already joined the job of node 0's store as node 1"));
  CHECK_THAT(r.output, !Contains("SIGABRT") && !Contains("is already taken"));
}

TEST_CASE("launcher: node 0's --node-timeout counts on every node, and a node given another "
          "says so",
          "[launcher]") {
  // Node 1 was not given one (10 s): it watches the other nodes with node 0's
  // 3 s, as node 0 does, and says so. The job itself runs as usual.
  const int port = lockstep::testing::unused_tcp_port();
  auto node = [&](int rank, const std::string& options) {
    return fmt::format("{} --nnodes 2 --node-rank {} --nproc-per-node 1 --master-addr 127.0.0.1 "
                       "--master-port {} --postmortem-dir '' {} {} group-sum",
                       bin_path("lockstep-run"), rank, port, options,
                       bin_path("launcher_probe"));
  };
  const std::string script = fmt::format(
      "export LOCKSTEP_TOKEN=t; {} & n0=$!; {}; echo \"node 1 exit $?\"; wait $n0; "
      "echo \"node 0 exit $?\"",
      node(0, "--node-timeout 3"), node(1, ""));
  const auto r = run_process({"/bin/bash", "-c", script}, kLimit);
  INFO(describe(r) << "\n" << r.output);
  CHECK_THAT(r.output, Contains("lockstep-run: node 1: node 0's --node-timeout 3 counts on every "
                                "node; this launcher's 10 is not used"));
  CHECK_THAT(r.output, Contains("group-sum rank=0 restart=0 sum=3 ok") &&
                           Contains("group-sum rank=1 restart=0 sum=3 ok") &&
                           Contains("node 1 exit 0") && Contains("node 0 exit 0"));
}

TEST_CASE("launcher: nodes whose launchers disagree on the job's shape stop at once, saying so",
          "[launcher]") {
  const int port = lockstep::testing::unused_tcp_port();
  auto node = [&](int rank, int nproc, int restarts, const std::string& probe) {
    return fmt::format("{} --nnodes 2 --node-rank {} --nproc-per-node {} --master-addr 127.0.0.1 "
                       "--master-port {} --grace-period 0.5 --max-restarts {} "
                       "--restart-backoff 0.1 --postmortem-dir '' {} {}",
                       bin_path("lockstep-run"), rank, nproc, port, restarts,
                       bin_path("launcher_probe"), probe);
  };
  auto run_nodes = [&](const std::string& node0, const std::string& node1) {
    const std::string script = fmt::format(
        "export LOCKSTEP_TOKEN=t; {} & n0=$!; {}; echo \"node 1 exit $?\"; wait $n0; "
        "echo \"node 0 exit $?\"",
        node0, node1);
    const auto r = run_process({"/bin/bash", "-c", script}, kLimit);
    UNSCOPED_INFO(describe(r) << "\n" << r.output);
    CHECK(r.seconds < 15);
    return r.output;
  };
  SECTION("--nproc-per-node") {
    // Node 0 numbers its rank 0 of 2, node 1 its ranks 3 to 5 of 6: they could
    // never meet, and waited in the rendezvous until the collective timeout.
    const auto out = run_nodes(node(0, 1, 1, "group-sum"), node(1, 3, 1, "group-sum"));
    CHECK_THAT(out, Contains("node 1: its launcher was started with --nnodes 2 --nproc-per-node 3 "
                             "--max-restarts 1, node 0's with --nnodes 2 --nproc-per-node 1 "
                             "--max-restarts 1"));
    CHECK_THAT(out, Contains("node 1 exit 2") && Contains("node 0 exit 1") &&
                        !Contains("restart 1 of 1") && !Contains("group-sum rank"));
  }
  SECTION("--max-restarts") {
    // Node 1 restarted alone: node 0's launcher ended, and node 1's said the
    // store was lost, as if node 0 had crashed.
    const auto out = run_nodes(node(0, 1, 0, "group-sum sleep"),
                               node(1, 1, 2, "group-sum fail-attempts=1:1"));
    CHECK_THAT(out, Contains("node 1: its launcher was started with --nnodes 2 --nproc-per-node 1 "
                             "--max-restarts 2, node 0's with --nnodes 2 --nproc-per-node 1 "
                             "--max-restarts 0"));
    CHECK_THAT(out, Contains("node 1 exit 2") && Contains("node 0 exit 1") &&
                        !Contains("store is gone"));
  }
}
