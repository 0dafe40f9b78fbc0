// The launcher tests' ways to start lockstep-run with the launcher_probe
// worker (tests/workers/launcher_probe.cpp), under a time limit, its output
// attached to the next failed assertion.
#pragma once

#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/types.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "support/subprocess.h"

namespace lockstep::testing {

using namespace std::chrono_literals;

// Generous for a loaded 2-core machine; a hang still fails instead of blocking ctest.
inline constexpr auto kLimit = 30s;

inline ProcessResult launch(std::vector<std::string> launcher_args, std::vector<std::string> probe_args,
                     const std::vector<std::string>& env = {},
                     std::chrono::milliseconds limit = kLimit) {
  std::vector<std::string> argv = {bin_path("lockstep-run")};
  argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
  argv.push_back(bin_path("launcher_probe"));
  argv.insert(argv.end(), probe_args.begin(), probe_args.end());
  auto result = run_process(argv, limit, env);
  UNSCOPED_INFO("lockstep-run " << describe(result) << ", output:\n" << result.output);
  return result;
}

// key=value pairs of each "rank=..." line the probe printed, by rank.
inline std::map<int, std::map<std::string, std::string>> probe_lines(const std::string& output) {
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

// The pids the probes wrote (pid-dir=DIR) into `dir`.
inline std::vector<pid_t> pids_in(const std::string& dir) {
  std::vector<pid_t> pids;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".pid") continue;
    pid_t pid = 0;
    std::ifstream(entry.path()) >> pid;
    pids.push_back(pid);
  }
  return pids;
}

// Every probe that wrote a pid file is gone (the launcher stopped and reaped it).
inline void check_no_orphans(const std::string& dir, size_t expected) {
  const auto pids = pids_in(dir);
  CHECK(pids.size() == expected);
  for (pid_t pid : pids) {
    INFO("pid " << pid);
    CHECK((kill(pid, 0) == -1 && errno == ESRCH));
  }
}

// Two launchers of a two-node job on this host (both nodes on 127.0.0.1),
// each with `probe_args`; their outputs one after the other, each followed
// by "node N exit CODE". `as_two_machines`: each node has its own
// LOCKSTEP_NODE_ID, so the default backend is shm+gloo, not shm.
inline ProcessResult two_local_nodes(const std::vector<std::string>& launcher_args,
                              const std::vector<std::string>& node0_args,
                              const std::vector<std::string>& node1_args,
                              int nproc_per_node = 1, bool as_two_machines = false) {
  const int port = lockstep::testing::unused_tcp_port();
  std::string script = "export LOCKSTEP_TOKEN=two-local-nodes; dir=$(mktemp -d); ";
  for (int node = 0; node < 2; ++node) {
    std::string line = fmt::format("{}{} --nnodes 2 --node-rank {} --nproc-per-node {} "
                                   "--master-addr 127.0.0.1 --master-port {}",
                                   as_two_machines ? fmt::format("LOCKSTEP_NODE_ID=node{} ", node)
                                                   : std::string(),
                                   bin_path("lockstep-run"), node, nproc_per_node, port);
    for (const auto& a : launcher_args) line += " " + a;
    line += fmt::format(" {}", bin_path("launcher_probe"));
    for (const auto& a : node == 0 ? node0_args : node1_args) line += " " + a;
    script += fmt::format("( {} > $dir/{} 2>&1; echo \"node {} exit $?\" >> $dir/{} ) & ", line,
                          node, node, node);
  }
  script += "wait; cat $dir/0 $dir/1; rm -rf $dir";
  auto result = run_process({"/bin/bash", "-c", script}, 60s);
  UNSCOPED_INFO("two nodes: " << describe(result) << ", output:\n" << result.output);
  return result;
}

}  // namespace lockstep::testing
