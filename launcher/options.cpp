#include "launcher/options.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>

#include <CLI/CLI.hpp>

#include "lockstep/config.h"
#include "lockstep/distributed/launch_env.h"
#include "lockstep/distributed/wire_protocol.h"

namespace lockstep::launcher {
namespace {

// Options that take a value in the next argument (unless written NAME=value).
const std::set<std::string> kValueOptions = {
    "-n", "--np", "-x", "--nproc-per-node", "--nproc_per_node", "--nnodes", "--node-rank",
    "--node_rank", "--master-addr", "--master_addr", "--master-port", "--master_port",
    "--token", "--grace-period", "--bind-to", "--max-restarts", "--max_restarts",
    "--restart-backoff", "--hang-timeout", "--node-timeout", "--postmortem-dir",
    "--postmortem-from"};

// mpirun spells some long options with one dash; CLI11 wants two.
std::string normalise(const std::string& arg) {
  for (const char* name : {"-np", "-tag-output", "-bind-to"}) {
    const std::string n = name;
    if (arg == n || arg.rfind(n + "=", 0) == 0) return "-" + arg;
  }
  return arg;
}

// Splits argv into the launcher's own arguments and the command: the command
// starts at the first argument that is not an option or an option's value, or
// after "--".
std::pair<std::vector<std::string>, std::vector<std::string>> split(int argc,
                                                                    const char* const* argv) {
  std::vector<std::string> own;
  std::vector<std::string> command;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;
    arg = normalise(arg);
    own.push_back(arg);
    if (kValueOptions.count(arg) && i + 1 < argc) own.push_back(argv[++i]);
  }
  for (; i < argc; ++i) command.emplace_back(argv[i]);
  return {own, command};
}

// CLI11 reads a whole number with a leading 0 as octal ("010" is 8, "08" is
// refused) and one with 0x as hex; the launcher's are decimal, as torchrun's
// and mpirun's are (a node rank cut from a zero-padded host name: node08).
CLI::Validator decimal() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const size_t sign = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
        const std::string digits = text.substr(sign);
        if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) {
              return std::isdigit(static_cast<unsigned char>(c));
            }))
          return fmt::format("'{}' is not a whole number", text);
        text = text.substr(0, sign) + digits.substr(std::min(digits.find_first_not_of('0'),
                                                             digits.size() - 1));
        return {};
      },
      "", "decimal");
}

bool valid_name(const std::string& name) {
  return !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
         });
}

// Why `name` cannot be exported: the launcher sets it for each rank itself,
// over any value -x gives (README.md, what each rank gets); empty if it can.
std::string set_by_launcher(const std::string& name) {
  static const std::map<std::string, std::string> kFlagFor = {
      {"WORLD_SIZE", "-np or --nproc-per-node and --nnodes"},
      {"LOCKSTEP_WORLD_SIZE", "-np or --nproc-per-node and --nnodes"},
      {"LOCAL_WORLD_SIZE", "-np or --nproc-per-node"},
      {"LOCKSTEP_LOCAL_WORLD_SIZE", "-np or --nproc-per-node"},
      {"LOCKSTEP_NUM_NODES", "--nnodes"},
      {"LOCKSTEP_NODE_RANK", "--node-rank"},
      {"GROUP_RANK", "--node-rank"},
      {"GROUP_WORLD_SIZE", "--nnodes"},
      {"ROLE_WORLD_SIZE", "-np or --nproc-per-node and --nnodes"},
      {"TORCHELASTIC_MAX_RESTARTS", "--max-restarts"},
      {"MASTER_ADDR", "--master-addr"},
      {"LOCKSTEP_STORE_ADDR", "--master-addr and --master-port"},
      {"LOCKSTEP_TOKEN", "--token"},
      {"LOCKSTEP_HEARTBEAT_MS", "--hang-timeout"},
      {"LOCKSTEP_HEARTBEAT_FD", "--hang-timeout"}};
  static const std::set<std::string> kOwn = [] {
    std::set<std::string> own = {"LOCKSTEP_RESTART_COUNT", "LOCKSTEP_JOB_ID",
                                 "LOCKSTEP_FLIGHT_RECORDER", "ROLE_NAME", "ROLE_RANK",
                                 "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE",
                                 distributed::kLauncherWireVar,
                                 distributed::kLauncherVersionVar};
    for (const auto& entry : kFlagFor) own.insert(entry.first);
    for (const auto& [var, value] : distributed::rank_variables({}, 1, 0)) own.insert(var);
    own.erase("MASTER_PORT");  // chooses the program's port (take_program_port())
    return own;
  }();
  if (!kOwn.contains(name)) return {};
  const auto flag = kFlagFor.find(name);
  return fmt::format("lockstep-run sets {} for each rank itself, over any value -x gives{}",
                     name,
                     flag == kFlagFor.end() ? std::string()
                                            : fmt::format("; to choose it, use {}", flag->second));
}

// -x MASTER_PORT=P chooses the port node 0 leaves to the program's rank 0
// (child_env.h) instead of a free one: not an export, since the launcher
// gives every node's ranks node 0's port.
void take_program_port(Options& o) {
  const auto it = std::find_if(o.exports.begin(), o.exports.end(),
                               [](const auto& e) { return e.first == "MASTER_PORT"; });
  if (it == o.exports.end()) return;
  const std::string text = it->second;
  o.exports.erase(it);
  const bool digits = !text.empty() && text.size() <= 5 &&
                      std::all_of(text.begin(), text.end(), [](char c) {
                        return std::isdigit(static_cast<unsigned char>(c));
                      });
  o.program_port = digits ? std::stoi(text) : 0;
  if (o.program_port < 1 || o.program_port > 65535)
    throw UsageError(fmt::format("-x MASTER_PORT={}: not a TCP port (1-65535); leave it out "
                                 "for a free one",
                                 text));
  if (o.program_port == o.master_port)
    throw UsageError(fmt::format("-x MASTER_PORT={}: that is --master-port, where lockstep-run "
                                 "serves its own store; give the program another port",
                                 text));
}

std::pair<std::string, std::string> resolve_export(const std::string& spec,
                                                   const runtime::EnvLookup& env) {
  const auto eq = spec.find('=');
  const std::string name = spec.substr(0, eq);
  if (!valid_name(name))
    throw UsageError(fmt::format("-x {}: '{}' is not a variable name", spec, name));
  if (const std::string why = set_by_launcher(name); !why.empty())
    throw UsageError(fmt::format("-x {}: {}", spec, why));
  if (eq != std::string::npos) return {name, spec.substr(eq + 1)};
  const auto value = env(name);
  if (!value)
    throw UsageError(fmt::format("-x {}: {} is not set in the launcher's environment; set it "
                                 "or write -x {}=value", name, name, name));
  return {name, *value};
}


// A number of seconds a flag gives: NaN, infinity and negative values are
// refused, and so is anything past about four months, which the launcher's
// millisecond clocks would overflow or never reach.
void check_seconds(const char* flag, double seconds, const char* note = "") {
  constexpr double kMax = 1e7;
  if (!(seconds >= 0 && seconds <= kMax))
    throw UsageError(fmt::format("{} {} must be a number of seconds from 0 to {:g}{}", flag,
                                 seconds, kMax, note));
}

// Every rank connects to --master-addr; a name that does not resolve would
// make each of them fail at start-up instead of this one clear error.
void check_resolves(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (found != nullptr) ::freeaddrinfo(found);
  if (rc != 0)
    throw UsageError(fmt::format("--master-addr {}: not an address or a host name that "
                                 "resolves ({}); give node 0's address",
                                 host, ::gai_strerror(rc)));
}

// The post-mortem is written only once a rank has failed, maybe hours in: a
// directory it could not be written to is said now, before a rank starts.
void check_postmortem_dir(const std::string& dir) {
  if (dir.empty()) return;  // printed only
  struct stat st {};
  std::string why;
  if (::stat(dir.c_str(), &st) != 0) why = std::strerror(errno);
  else if (!S_ISDIR(st.st_mode)) why = "not a directory";
  else if (::access(dir.c_str(), W_OK | X_OK) != 0) why = std::strerror(errno);
  if (!why.empty())
    throw UsageError(fmt::format("--postmortem-dir {}: {}; give a directory that can be "
                                 "written to, or '' to print the post-mortem only",
                                 dir, why));
}

void validate(Options& o, bool np_given, const runtime::EnvLookup& env) {
  if (!o.postmortem_from.empty()) {
    if (!o.command.empty() || np_given || o.nproc_per_node != 0)
      throw UsageError("--postmortem-from DIR only reads DIR: give no program and no -np");
    return;
  }
  if (o.command.empty())
    throw UsageError("no program given; usage: lockstep-run -np N [options] [--] program [args...]");
  if (o.nproc_per_node == 0)
    throw UsageError("say how many processes to start: -np N (one node) or --nproc-per-node N");
  if (o.nproc_per_node < 1)
    throw UsageError(fmt::format("the number of processes must be at least 1, not {}",
                                 o.nproc_per_node));
  if (o.nnodes < 1) throw UsageError(fmt::format("--nnodes {} must be at least 1", o.nnodes));
  if (np_given && o.nnodes > 1)
    throw UsageError("-np is for one node; with --nnodes use --nproc-per-node (per node)");
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw UsageError(fmt::format("--node-rank {} is out of range; it must be from 0 to {}",
                                 o.node_rank, o.nnodes - 1));
  if (o.master_port < 0 || o.master_port > 65535)
    throw UsageError(fmt::format("--master-port {} is not a TCP port (0-65535)", o.master_port));
  check_seconds("--grace-period", o.grace_period_s);
  if (o.max_restarts < 0)
    throw UsageError(fmt::format("--max-restarts {} must not be negative", o.max_restarts));
  check_seconds("--hang-timeout", o.hang_timeout_s, " (0 turns it off)");
  // Beats come at most every 20 ms (child_env.cpp): a shorter timeout would
  // call every rank hung, and one under a millisecond was read as 0 (off).
  if (o.hang_timeout_s > 0 && o.hang_timeout_s < 0.1)
    throw UsageError(fmt::format("--hang-timeout {:g} is too short to tell a hung rank from a "
                                 "busy one; give at least 0.1 s (10 s is usual), or 0 to turn "
                                 "it off",
                                 o.hang_timeout_s));
  check_seconds("--restart-backoff", o.restart_backoff_s);
  // Launchers beat 4 times a second (node_link.cpp); a store round trip
  // between nodes may take a while under load.
  check_seconds("--node-timeout", o.node_timeout_s);
  if (o.node_timeout_s < 1)
    throw UsageError(fmt::format("--node-timeout {:g} is too short to tell a lost node from a "
                                 "slow one; give at least 1 s (10 s is usual)",
                                 o.node_timeout_s));
  // [::1], as in a URL, is the address ::1 (ranks get it bracketed with the port).
  if (o.master_addr.size() > 2 && o.master_addr.front() == '[' && o.master_addr.back() == ']')
    o.master_addr = o.master_addr.substr(1, o.master_addr.size() - 2);
  if (!o.master_addr.empty()) check_resolves(o.master_addr);

  if (o.token.empty()) o.token = env("LOCKSTEP_TOKEN").value_or("");
  if (o.nnodes > 1) {
    // Every node's launcher must agree on where the store is and on its token.
    if (o.master_addr.empty())
      throw UsageError("--nnodes > 1 needs --master-addr: an address of node 0 that every "
                       "node can reach");
    if (o.master_port == 0)
      throw UsageError("--nnodes > 1 needs a fixed --master-port (the same on every node)");
    if (o.token.empty())
      throw UsageError("--nnodes > 1 needs the same store token on every node: set "
                       "LOCKSTEP_TOKEN (preferred: not visible in ps) or pass --token");
  }
}

}  // namespace

ParsedCommandLine parse_command_line(int argc, const char* const* argv,
                                     const runtime::EnvLookup& env) {
  auto [own, command] = split(argc, argv);

  ParsedCommandLine parsed;
  Options& o = parsed.options;
  std::vector<std::string> exports;
  int np = 0;

  CLI::App app("Starts one process per rank of a lockstep job and supervises them: when one "
               "fails, the others are stopped.\n\n"
               "  lockstep-run -np N [options] [--] program [args...]\n"
               "  lockstep-run --nnodes M --node-rank R --nproc-per-node N --master-addr A "
               "--master-port P [options] program [args...]\n"
               "  lockstep-run --postmortem-from DIR\n",
               "lockstep-run");
  app.set_help_flag("-h,--help", "Print this help and exit");
  app.set_version_flag("--version", "lockstep-run " LOCKSTEP_VERSION_STRING,
                       "Print lockstep's version and exit");
  app.add_option("-n,--np", np, "Processes to start on this node (one node: same as "
                 "--nproc-per-node N --nnodes 1); -np also works")
      ->transform(decimal());
  app.add_option("--nproc-per-node,--nproc_per_node", o.nproc_per_node,
                 "Processes per node (several nodes)")
      ->transform(decimal());
  app.add_option("--nnodes", o.nnodes, "Number of nodes, one launcher each")
      ->transform(decimal())
      ->capture_default_str();
  app.add_option("--node-rank,--node_rank", o.node_rank, "This node's index; node 0 serves the "
                 "store")
      ->transform(decimal())
      ->capture_default_str();
  app.add_option("--master-addr,--master_addr", o.master_addr,
                 "Address of node 0 the ranks reach the store at (default 127.0.0.1)");
  app.add_option("--master-port,--master_port", o.master_port,
                 "Store port on node 0 (default 0: any free port, one node only)")
      ->transform(decimal());
  app.add_option("--token", o.token, "Store token shared by all nodes (default: LOCKSTEP_TOKEN, "
                 "else random; required with --nnodes > 1)");
  app.add_option("-x", exports, "Export VAR=value to the ranks, or VAR with the launcher's "
                 "value (repeatable)")->take_all()->expected(1);
  app.add_flag("--tag-output", o.tag_output, "Prefix each line of output with [rank N]");
  std::string bind_to = "none";
  app.add_option("--bind-to", bind_to, "core: each rank on its own even share of this node's "
                 "cores (whole cores; SMT siblings stay together), as mpirun binds; none: "
                 "wherever the kernel schedules it")
      ->check(CLI::IsMember({"none", "core"}))
      ->capture_default_str();
  app.add_option("--grace-period", o.grace_period_s, "Seconds between SIGTERM and SIGKILL when "
                 "stopping ranks")->capture_default_str();
  app.add_option("--max-restarts,--max_restarts", o.max_restarts, "When a rank fails, stop the "
                 "others and start the whole group again, up to N times (LOCKSTEP_RESTART_COUNT "
                 "tells the ranks which attempt they are)")
      ->transform(decimal())
      ->capture_default_str();
  app.add_option("--restart-backoff", o.restart_backoff_s, "Seconds before the first restart, "
                 "doubling for each later one (at most 60)")->capture_default_str();
  app.add_option("--hang-timeout", o.hang_timeout_s, "A rank that joined its process group and "
                 "then sends no heartbeat, or makes no progress (no CPU used, not waiting for "
                 "other ranks, not reading or writing a checkpoint), for this many seconds is hung: the job "
                 "is stopped, or restarted under --max-restarts; 0: off")->capture_default_str();
  app.add_option("--node-timeout", o.node_timeout_s, "Several nodes: another node's launcher "
                 "not heard from for this many seconds (killed, its host down or cut off) "
                 "fails the job, restarts included; node 0's value counts on every node")
      ->capture_default_str();
  app.add_option("--postmortem-dir", o.postmortem_dir, "When a rank fails or hangs, or the job "
                 "is stopped, the launcher prints what every rank was doing in its last "
                 "collectives and writes it as JSON to DIR/lockstep-postmortem-<job id>-node<N>-"
                 "attempt<K>.json; '' prints it only")->capture_default_str();
  app.add_option("--postmortem-from", o.postmortem_from, "Start nothing: print the post-mortem "
                 "of a job that another launcher (mpirun, torchrun, srun) ran with "
                 "LOCKSTEP_POSTMORTEM_DIR=DIR, from the parts its ranks wrote there");
  app.footer(
      "\nEach rank gets LOCKSTEP_RANK, LOCKSTEP_WORLD_SIZE, LOCKSTEP_LOCAL_RANK,\n"
      "LOCKSTEP_LOCAL_WORLD_SIZE, LOCKSTEP_NODE_RANK, LOCKSTEP_NUM_NODES, LOCKSTEP_STORE_ADDR,\n"
      "LOCKSTEP_TOKEN, torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR\n"
      "and MASTER_PORT (a free port on node 0 for a torchrun program's own rank 0 to serve its\n"
      "store on, as torchrun --standalone leaves it, or -x MASTER_PORT=P; lockstep's ranks use\n"
      "LOCKSTEP_STORE_ADDR),\n"
      "torchrun's GROUP_RANK, GROUP_WORLD_SIZE, ROLE_NAME, ROLE_RANK, ROLE_WORLD_SIZE,\n"
      "TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS and TORCHELASTIC_USE_AGENT_STORE,\n"
      "LOCKSTEP_RESTART_COUNT, LOCKSTEP_JOB_ID (one per launch, the same for every\n"
      "attempt), LOCKSTEP_FLIGHT_RECORDER, LOCKSTEP_HEARTBEAT_FD and LOCKSTEP_HEARTBEAT_MS (its\n"
      "heartbeat socket, descriptor 3, and how often to beat; not with --hang-timeout 0),\n"
      "LOCKSTEP_LAUNCHER_WIRE and LOCKSTEP_LAUNCHER_VERSION (this launcher's wire protocol\n"
      "and version: a rank of another protocol refuses to start), and\n"
      "OMP_NUM_THREADS=1 unless set (with --tag-output, PYTHONUNBUFFERED=1 unless set too).\n"
      "-x cannot set these (OMP_NUM_THREADS, PYTHONUNBUFFERED and MASTER_PORT aside).\n"
      "CUDA_VISIBLE_DEVICES is left alone: a rank uses cuda:<local rank>. Global rank = node\n"
      "rank * nproc-per-node + local rank.\n"
      "Ranks read stdin from /dev/null. SIGINT, SIGTERM and SIGHUP are forwarded to every rank\n"
      "(a second one sends SIGKILL). Exit status: 0 when every rank exits 0, else the first\n"
      "failing rank's code (128 + signal number when it was killed by a signal) of the last\n"
      "attempt; a rank whose program cannot run exits 126, or 127 when it is not there.");

  // CLI11 wants the program name first.
  std::vector<std::string> args = own;
  std::reverse(args.begin(), args.end());
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    parsed.help = app.help();
    return parsed;
  } catch (const CLI::CallForVersion& e) {
    parsed.help = std::string(e.what()) + "\n";
    return parsed;
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }

  if (np != 0) {
    if (o.nproc_per_node != 0)
      throw UsageError("give either -np or --nproc-per-node, not both");
    o.nproc_per_node = np;
  }
  if (app.count("-n") && np < 1)
    throw UsageError(fmt::format("-np {} must be at least 1", np));
  if (app.count("--nproc-per-node") && o.nproc_per_node < 1)
    throw UsageError(fmt::format("--nproc-per-node {} must be at least 1", o.nproc_per_node));
  o.bind_to_core = bind_to == "core";
  o.command = std::move(command);
  for (const auto& spec : exports) o.exports.push_back(resolve_export(spec, env));
  validate(o, app.count("-n") > 0, env);
  take_program_port(o);
  // Only a directory asked for: the default (the working directory) may be
  // one a job runs in without writing to it, which says so after a failure.
  if (app.count("--postmortem-dir")) check_postmortem_dir(o.postmortem_dir);
  return parsed;
}

}  // namespace lockstep::launcher
