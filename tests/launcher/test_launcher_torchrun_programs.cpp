// lockstep-run starting programs written for torchrun (a PyTorch script's
// init_process_group): MASTER_PORT left to the program's own store, torchrun's
// worker variables, Python's output and scripts. As in test_launcher.cpp, each
// test starts the real launcher with the launcher_probe worker under a time
// limit; none needs PyTorch.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "launcher/launch_probe.h"

using lockstep::testing::bin_path;
using lockstep::testing::describe;
using lockstep::testing::kLimit;
using lockstep::testing::launch;
using lockstep::testing::probe_lines;
using lockstep::testing::run_process;
using Catch::Matchers::Contains;
using lockstep::testing::TempDir;

namespace {

// Leaves `port` of 127.0.0.1 in TIME_WAIT on its server side, as a job whose
// rank 0 ended first leaves its store's port.
void leave_server_time_wait(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int server = socket(AF_INET, SOCK_STREAM, 0);
  const int on = 1;
  REQUIRE(setsockopt(server, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) == 0);
  REQUIRE(bind(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(listen(server, 1) == 0);
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  const int accepted = accept(server, nullptr, nullptr);
  REQUIRE(accepted >= 0);
  close(server);
  close(accepted);  // the server side closes first ...
  char byte = 0;
  REQUIRE(read(client, &byte, 1) == 0);  // ... the client sees it ...
  close(client);                         // ... and answers: TIME_WAIT on `port`
}

}  // namespace

TEST_CASE("launcher: a program written for torchrun serves its own store on MASTER_PORT",
          "[launcher]") {
  // As a PyTorch program's init_process_group("gloo") does: rank 0 serves a
  // store on MASTER_PORT and every rank connects to MASTER_ADDR:MASTER_PORT.
  // MASTER_PORT was lockstep-run's own store's port, so rank 0 failed with
  // "Address already in use".
  const auto r = launch({"-np", "3"}, {"master-sum"});
  INFO(r.output);
  CHECK(r.ok());
  for (int rank = 0; rank < 3; ++rank)
    CHECK_THAT(r.output, Contains(fmt::format("master-sum rank={} sum=6 expected=6 ok", rank)));
}

TEST_CASE("launcher: --tag-output ranks get PYTHONUNBUFFERED=1 unless it is set",
          "[launcher]") {
  // Their stdout is the launcher's pipe, not its terminal: a Python rank
  // would hold its prints back (and lose them when stopped) without it.
  // The launcher starts without the variable, whatever the test's own has.
  auto shown = [](std::vector<std::string> launcher_args) {
    std::vector<std::string> argv = {"/usr/bin/env", "-u", "PYTHONUNBUFFERED",
                                     bin_path("lockstep-run")};
    argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
    argv.insert(argv.end(), {bin_path("launcher_probe"), "print", "show=PYTHONUNBUFFERED"});
    const auto r = run_process(argv, kLimit);
    INFO(describe(r) << "\n" << r.output);
    REQUIRE(r.ok());
    std::set<std::string> values;
    for (const auto& [rank, kv] : probe_lines(r.output)) values.insert(kv.at("PYTHONUNBUFFERED"));
    return values;
  };
  CHECK(shown({"-np", "2", "--tag-output"}) == std::set<std::string>{"1"});
  CHECK(shown({"-np", "2", "--tag-output", "-x", "PYTHONUNBUFFERED=kept"}) ==
        std::set<std::string>{"kept"});
  // Without the option the ranks write where the launcher does, untouched.
  CHECK(shown({"-np", "2"}) == std::set<std::string>{"(unset)"});
}

TEST_CASE("launcher: a Python script given as the program is refused, saying to run python3",
          "[launcher]") {
  // torchrun's `torchrun --nproc_per_node 2 train.py` runs python on it. Given
  // so to lockstep-run it was "not executable (chmod +x it)", and once made
  // executable /bin/sh ran its lines as commands ("import: not found").
  TempDir dir;
  std::ofstream(dir.file("train.py")) << "import os\nprint('ran')\n";
  const auto lr = bin_path("lockstep-run");
  auto run_in_dir = [&](const std::string& program) {
    const auto r = run_process(
        {"/bin/sh", "-c", "cd \"$0\" && exec \"$1\" -np 2 \"$2\"", dir.str(), lr, program},
        kLimit);
    INFO(program << ": " << describe(r) << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Contains("run it with Python, as torchrun does (lockstep-run -np N "
                                  "python3 " + program + ")") &&
                             !Contains("import: not found") && !Contains("ran\n"));
  };
  run_in_dir("train.py");
  run_in_dir("./train.py");
  std::filesystem::permissions(dir.file("train.py"), std::filesystem::perms::owner_exec,
                               std::filesystem::perm_options::add);
  run_in_dir("./train.py");

  // With its #! line it is a program like any other.
  std::ofstream(dir.file("tool.py")) << "#!/bin/sh\necho \"tool rank $RANK\"\n";
  std::filesystem::permissions(dir.file("tool.py"), std::filesystem::perms::owner_all);
  const auto r = run_process({lr, "-np", "2", dir.file("tool.py")}, kLimit);
  INFO(describe(r) << "\n" << r.output);
  CHECK(r.ok());
  CHECK_THAT(r.output, Contains("tool rank 0") && Contains("tool rank 1"));
}

TEST_CASE("launcher: a torchrun program's ranks on two nodes meet at node 0's MASTER_PORT",
          "[launcher]") {
  // Node 0's launcher picks the port and every node's ranks get that one.
  const int port = lockstep::testing::unused_tcp_port();
  auto node = [&](int rank) {
    return fmt::format("{} --nnodes 2 --node-rank {} --nproc-per-node 2 --master-addr 127.0.0.1 "
                       "--master-port {} --postmortem-dir '' {} print show=MASTER_PORT "
                       "master-sum",
                       bin_path("lockstep-run"), rank, port, bin_path("launcher_probe"));
  };
  const std::string script = fmt::format(
      "export LOCKSTEP_TOKEN=t; {} & n0=$!; {} & n1=$!; wait $n0; e0=$?; wait $n1; "
      "echo \"exits $e0 $?\"",
      node(0), node(1));
  const auto r = run_process({"/bin/bash", "-c", script}, kLimit);
  INFO(describe(r) << "\n" << r.output);
  CHECK_THAT(r.output, Contains("exits 0 0"));
  for (int rank = 0; rank < 4; ++rank)
    CHECK_THAT(r.output, Contains(fmt::format("master-sum rank={} sum=10 expected=10 ok", rank)));
  std::set<std::string> ports;
  const auto lines = probe_lines(r.output);
  CHECK(lines.size() == 4);
  for (const auto& [rank, kv] : lines) ports.insert(kv.at("MASTER_PORT"));
  CHECK(ports.size() == 1);
  CHECK_FALSE(ports.contains(std::to_string(port)));
}

TEST_CASE("launcher: -x MASTER_PORT chooses the port node 0 leaves to a torchrun program",
          "[launcher]") {
  // A firewall between nodes lets through ports chosen beforehand: the
  // program's, as well as --master-port.
  const int chosen = lockstep::testing::unused_tcp_port();
  const auto one = launch({"-np", "2", "-x", fmt::format("MASTER_PORT={}", chosen)},
                          {"print", "show=MASTER_PORT"});
  REQUIRE(one.ok());
  const auto lines = probe_lines(one.output);
  CHECK(lines.size() == 2);
  for (const auto& [rank, kv] : lines) CHECK(kv.at("MASTER_PORT") == std::to_string(chosen));

  // The last job's rank 0 ended first: its connections wait out TIME_WAIT
  // there, which PyTorch's store (SO_REUSEADDR) binds over.
  leave_server_time_wait(chosen);
  const auto again = launch({"-np", "1", "-x", fmt::format("MASTER_PORT={}", chosen)},
                            {"print", "show=MASTER_PORT"});
  CHECK(again.ok());
  CHECK_THAT(again.output, Contains(fmt::format("MASTER_PORT={}", chosen)));

  // Every node's ranks get it; a node that names another port is refused.
  const int store = lockstep::testing::unused_tcp_port();
  auto node = [&](int rank, int port) {
    return fmt::format("{} --nnodes 2 --node-rank {} --nproc-per-node 1 --master-addr 127.0.0.1 "
                       "--master-port {} --postmortem-dir '' -x MASTER_PORT={} {} print "
                       "show=MASTER_PORT",
                       bin_path("lockstep-run"), rank, store, port, bin_path("launcher_probe"));
  };
  const auto two = run_process(
      {"/bin/bash", "-c",
       fmt::format("export LOCKSTEP_TOKEN=t; {} & n0=$!; {} & n1=$!; wait $n0; e0=$?; "
                   "wait $n1; echo \"exits $e0 $?\"",
                   node(0, chosen), node(1, chosen))},
      kLimit);
  INFO(describe(two) << "\n" << two.output);
  CHECK_THAT(two.output, Contains("exits 0 0"));
  const auto both = probe_lines(two.output);
  CHECK(both.size() == 2);
  for (const auto& [rank, kv] : both) CHECK(kv.at("MASTER_PORT") == std::to_string(chosen));

  const int store2 = lockstep::testing::unused_tcp_port();
  const auto differs = run_process(
      {"/bin/bash", "-c",
       fmt::format("export LOCKSTEP_TOKEN=t; {} > /dev/null 2>&1 & n0=$!; {}; echo \"node 1 "
                   "exit $?\"; wait $n0; echo \"node 0 exit $?\"",
                   fmt::format("{} --nnodes 2 --node-rank 0 --nproc-per-node 1 --master-addr "
                               "127.0.0.1 --master-port {} --postmortem-dir '' {} wait-ms=30000",
                               bin_path("lockstep-run"), store2, bin_path("launcher_probe")),
                   fmt::format("{} --nnodes 2 --node-rank 1 --nproc-per-node 1 --master-addr "
                               "127.0.0.1 --master-port {} --postmortem-dir '' -x "
                               "MASTER_PORT={} {} print",
                               bin_path("lockstep-run"), store2, chosen,
                               bin_path("launcher_probe")))},
      kLimit);
  INFO(describe(differs) << "\n" << differs.output);
  // Node 0 is told, and stops its ranks, as for another --nnodes.
  CHECK_THAT(differs.output, Contains("node 1 exit 2") && Contains("node 0 exit 1") &&
                                 Contains("-x MASTER_PORT=" + std::to_string(chosen)));

  // Not a port, or lockstep's own store's: refused before any rank starts.
  const auto bad = launch({"-np", "1", "-x", "MASTER_PORT=0x10"}, {"print"});
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Contains("-x MASTER_PORT=0x10: not a TCP port"));
  const auto same = launch({"-np", "1", "--master-port", std::to_string(store), "-x",
                            fmt::format("MASTER_PORT={}", store)},
                           {"print"});
  CHECK(same.exit_code == 2);
  CHECK_THAT(same.output, Contains("that is --master-port"));
}
