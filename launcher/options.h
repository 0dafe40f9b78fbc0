// lockstep-run's command line: what to start, how many, and on which node.
//
//   lockstep-run -np 4 [--tag-output] [--bind-to core] [-x VAR[=value]]... [--] prog args...
//   lockstep-run --nnodes 2 --node-rank 0 --nproc-per-node 4
//                --master-addr 10.0.0.1 --master-port 29500 --token T prog args...
//   lockstep-run --postmortem-from DIR
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "lockstep/runtime/env.h"
#include "lockstep/runtime/error.h"

namespace lockstep::launcher {

// A mistake on the command line: main prints it and exits 2.
class UsageError : public Error {
 public:
  using Error::Error;
};

struct Options {
  int nproc_per_node = 0;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;  // where node 0's store listens; empty: this host (127.0.0.1)
  int master_port = 0;      // 0: any free port (one node only)
  std::string token;        // --token, else LOCKSTEP_TOKEN; empty: a random one
  std::vector<std::pair<std::string, std::string>> exports;  // -x, resolved to values
  // -x MASTER_PORT=P: the port on node 0 left to the program's own rank 0
  // (program_port.h), one a firewall can let through; 0: a free one.
  int program_port = 0;
  bool tag_output = false;
  bool bind_to_core = false;  // --bind-to core (see cpu_binding.h); default none
  double grace_period_s = 5.0;  // SIGTERM -> SIGKILL
  // --max-restarts: how many times the whole group is started again after a
  // rank fails (not after the launcher is stopped by a signal); each attempt
  // waits restart_backoff_s * 2^(restarts before it), at most 60 s, first.
  int max_restarts = 0;
  double restart_backoff_s = 1.0;
  // --hang-timeout: a rank whose heartbeats stop, or say it made no progress,
  // for this long is hung (runtime/liveness.h); 0: not watched.
  double hang_timeout_s = 10.0;
  // --node-timeout: another node's launcher whose beats stop for this long is
  // gone (killed, its host down or cut off), and the job fails. Node 0's
  // counts on every node (launcher/node_link.h).
  double node_timeout_s = 10.0;
  // --postmortem-dir: where the post-mortem of a failed attempt is written as
  // JSON (launcher/postmortem.h); empty: printed only.
  std::string postmortem_dir = ".";
  // --postmortem-from: start nothing, report from the parts ranks under
  // another launcher wrote to this directory (launcher/postmortem.h).
  std::string postmortem_from;
  std::vector<std::string> command;  // program and its arguments

  int world_size() const { return nproc_per_node * nnodes; }
};

struct ParsedCommandLine {
  Options options;
  std::string help;  // non-empty: --help or --version was asked for; print it and exit 0
};

// Parses argv (argv[0] is the launcher). `env` resolves `-x VAR` and
// LOCKSTEP_TOKEN. Throws UsageError saying what is wrong.
ParsedCommandLine parse_command_line(int argc, const char* const* argv,
                                     const runtime::EnvLookup& env);

}  // namespace lockstep::launcher
