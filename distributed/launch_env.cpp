#include "lockstep/distributed/launch_env.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <vector>

#include "lockstep/distributed/env_slurm.h"
#include "lockstep/distributed/store/listen_address.h"
#include "lockstep/distributed/wire_protocol.h"
#include "lockstep/runtime/env.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/stable_hash.h"

namespace lockstep::distributed {
namespace {

// The variable names one launcher sets. Empty names: the launcher has none.
struct Source {
  const char* name;  // RankInfo::source
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
  const char* node_rank;
};

// In precedence order. Slurm's world and local sizes are read through
// slurm_view() below. PMI's local rank and size have two names: Cray's PMI
// (PALS, aprun) sets PMI_LOCAL_RANK and PMI_LOCAL_SIZE, MPICH's and Intel
// MPI's hydra MPI_LOCALRANKID and MPI_LOCALNRANKS.
constexpr std::array<Source, 7> kSources = {{
    {"lockstep-run", "LOCKSTEP_RANK", "LOCKSTEP_WORLD_SIZE", "LOCKSTEP_LOCAL_RANK",
     "LOCKSTEP_LOCAL_WORLD_SIZE", "LOCKSTEP_NODE_RANK"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"},
    {"open-mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", ""},
    {"pmi", "PMI_RANK", "PMI_SIZE", "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE", ""},
    {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", ""},
    {"slurm", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID",
     "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID"},
    {"pmix", "PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE", ""},
}};

bool is_set(const EnvLookup& env, const char* name) {
  return name[0] != '\0' && env(name).has_value();
}

bool is(const Source* source, std::string_view name) {
  return source != nullptr && source->name == name;
}

// A Slurm task is one of a step (srun): a batch script's shell has
// SLURM_PROCID and SLURM_NTASKS too, but no step id.
bool is_slurm_task(const EnvLookup& env) {
  return is_set(env, "SLURM_PROCID") && (is_set(env, "SLURM_STEP_ID") || is_set(env, "SLURM_STEPID"));
}

// srun --mpi=pmi2 gives each task of its step PMI_RANK and PMI_SIZE, with
// PMI_JOBID "<job>.<step>". Those tasks are Slurm's, whose own variables
// also say how many share a node and where task 0 is. An mpiexec (hydra)
// inside an allocation sets PMI_RANK and PMI_SIZE for its ranks but leaves
// PMI_JOBID and SLURM_* as the task it runs in had them (a shell from
// srun --pty, or its proxies' step): there PMI's rank or size differs from
// Slurm's, and the ranks are PMI's.
bool slurm_serves_pmi(const EnvLookup& env) {
  const auto pmi_job = env("PMI_JOBID");
  const auto job = env("SLURM_JOB_ID") ? env("SLURM_JOB_ID") : env("SLURM_JOBID");
  const auto step = env("SLURM_STEP_ID") ? env("SLURM_STEP_ID") : env("SLURM_STEPID");
  const auto tasks = env("SLURM_STEP_NUM_TASKS") ? env("SLURM_STEP_NUM_TASKS")
                                                 : env("SLURM_NTASKS");
  return is_slurm_task(env) && pmi_job && job && step && *pmi_job == *job + "." + *step &&
         env("PMI_RANK") == env("SLURM_PROCID") && env("PMI_SIZE") == tasks;
}

// Whether `source` launched this process: its rank variable is set, or with
// `world_size_alone`, its world size.
bool detected(const EnvLookup& env, const Source& source, bool world_size_alone) {
  if (is(&source, "slurm")) return is_slurm_task(env);
  if (is(&source, "pmi") && slurm_serves_pmi(env)) return false;
  // Cray's names for PMI's local rank and size, only where Cray's PMI set them.
  if (std::string_view(source.local_rank) == "PMI_LOCAL_RANK" &&
      !is_set(env, source.local_rank) && !is_set(env, source.local_world_size))
    return false;
  return is_set(env, source.rank) || (world_size_alone && is_set(env, source.world_size));
}

// The first launcher whose rank is set. A world size alone counts only where
// none is: a batch script may export WORLD_SIZE (with MASTER_ADDR and
// MASTER_PORT) for every task of an srun, as PyTorch's Slurm recipes do.
// Without a rank, it names the launcher whose rank variable is missing.
const Source* find_source(const EnvLookup& env) {
  for (const bool world_size_alone : {false, true})
    for (const auto& candidate : kSources)
      if (detected(env, candidate, world_size_alone)) return &candidate;
  return nullptr;
}

// Slurm's variables as one number each: the step's task count (a step may
// use fewer tasks than its job), and this node's entry of the run-length
// encoded tasks-per-node list, which Slurm always sets (SLURM_NTASKS_PER_NODE
// only with --ntasks-per-node).
EnvLookup slurm_view(const EnvLookup& env) {
  return [env](const std::string& name) -> std::optional<std::string> {
    if (name == "SLURM_STEP_NUM_TASKS") {
      if (auto tasks = env(name)) return tasks;
      return env("SLURM_NTASKS");
    }
    if (name == "SLURM_STEP_TASKS_PER_NODE") {
      for (const char* list : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
        if (const auto text = env(list)) {
          const int node = runtime::read_whole_number(env, "SLURM_NODEID", 0).value_or(0);
          return std::to_string(slurm::tasks_on_node(*text, node, list));
        }
      }
      return env("SLURM_NTASKS_PER_NODE");
    }
    return env(name);
  };
}

// Launchers that start this process but tell its rank and world size only
// over their own protocol, which lockstep does not speak: read as no launcher
// (or as the Slurm task they run in), every process would train alone as
// rank 0 of 1. Refused, saying how to start the job instead.
void refuse_unreadable_launcher(const EnvLookup& env, const Source* source) {
  // MPICH's and Intel MPI's hydra with -pmi-port: PMI_PORT and PMI_ID (the
  // rank) instead of PMI_FD, PMI_RANK and PMI_SIZE.
  if (source == nullptr && (is_set(env, "PMI_PORT") || is_set(env, "PMI_ID"))) {
    throw Error(fmt::format(
        "PMI_PORT={} and PMI_ID={} say a PMI process manager started this process in port mode "
        "(mpiexec -pmi-port), which gives the world size only over its PMI connection; "
        "lockstep reads the rank and world size from the environment, so run mpiexec without "
        "-pmi-port (it then sets PMI_RANK and PMI_SIZE), or launch with lockstep-run, torchrun "
        "or srun",
        runtime::quoted_value(env("PMI_PORT").value_or("")),
        runtime::quoted_value(env("PMI_ID").value_or(""))));
  }
  // A PMIx launcher other than Slurm's (PRRTE's prterun) inside a Slurm task:
  // PMIX_RANK, but no world size, beside the task's own SLURM_* variables.
  // Slurm's PMIx names its namespace slurm.pmix.<job>.<step>.
  const auto pmix_namespace = env("PMIX_NAMESPACE");
  if (is(source, "slurm") && is_set(env, "PMIX_RANK") && pmix_namespace &&
      pmix_namespace->rfind("slurm.pmix.", 0) != 0) {
    throw Error(fmt::format(
        "PMIX_RANK={} in PMIx namespace {} says a PMIx launcher other than Slurm started this "
        "process inside Slurm task {} of {}, and no variable gives its world size; start the "
        "job with srun, Open MPI's mpirun (which sets OMPI_COMM_WORLD_RANK and _SIZE), "
        "lockstep-run or torchrun",
        runtime::quoted_value(*env("PMIX_RANK")), runtime::quoted_value(*pmix_namespace),
        env("SLURM_PROCID").value_or("?"),
        env("SLURM_STEP_NUM_TASKS").value_or(env("SLURM_NTASKS").value_or("?"))));
  }
}

int require_int(const EnvLookup& env, const Source& source, const char* name, int minimum) {
  const auto value = runtime::read_whole_number(env, name, minimum);
  LOCKSTEP_CHECK(value.has_value(),
                 "{} is not set, but other {} variables are ({} and {} go together); "
                 "set {} or unset the others",
                 name, source.name, source.rank, source.world_size, name);
  return *value;
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

// MASTER_ADDR + MASTER_PORT, both or neither. A lone one is ignored for a
// single process (a shell may export MASTER_ADDR for other jobs).
void read_master(const EnvLookup& env, RankInfo& info) {
  const auto addr = env("MASTER_ADDR");
  const auto port = env("MASTER_PORT");
  if (!addr && !port) return;
  if (info.world_size == 1 && !(addr && port)) return;
  LOCKSTEP_CHECK(addr.has_value(), "MASTER_PORT is set but MASTER_ADDR is not; set "
                 "MASTER_ADDR to the host of rank 0 (e.g. MASTER_ADDR=10.0.0.1)");
  // e.g. MASTER_ADDR=$(scontrol show hostnames ... | head -n 1) where that failed.
  LOCKSTEP_CHECK(!addr->empty(), "MASTER_ADDR is set but empty (did the command that "
                 "computed it fail?); set it to the host of rank 0 (e.g. MASTER_ADDR=10.0.0.1)");
  LOCKSTEP_CHECK(port.has_value(), "MASTER_ADDR={} is set but MASTER_PORT is not; set "
                 "MASTER_PORT to the store's port (e.g. MASTER_PORT=29500)", *addr);
  info.store_host = *addr;
  // A bracketed IPv6 address is accepted as [::1] and used as ::1.
  if (info.store_host.size() > 2 && info.store_host.front() == '[' && info.store_host.back() == ']')
    info.store_host = info.store_host.substr(1, info.store_host.size() - 2);
  info.store_port = *runtime::read_whole_number(env, "MASTER_PORT", 1);
  LOCKSTEP_CHECK(info.store_port <= 65535, "MASTER_PORT={} is not a TCP port (1-65535)",
                 info.store_port);
}

// torchrun's agent serves its own store on MASTER_PORT under the default
// (static) rendezvous and tells its workers so; with --standalone or a c10d
// rendezvous MASTER_PORT is a free port left for rank 0.
bool torchrun_agent_serves_master_port(const EnvLookup& env) {
  const auto flag = env("TORCHELASTIC_USE_AGENT_STORE");
  return flag && (lower(*flag) == "true" || *flag == "1");
}

// Slurm without MASTER_ADDR/MASTER_PORT: rank 0 serves on the step's first
// node, where Slurm places task 0, at a port from the job and step ids.
void read_slurm_store(const EnvLookup& env, RankInfo& info) {
  const char* list_name = is_set(env, "SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST"
                          : is_set(env, "SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST"
                                                              : "SLURM_NODELIST";
  const auto list = env(list_name);
  const auto job = env("SLURM_JOB_ID") ? env("SLURM_JOB_ID") : env("SLURM_JOBID");
  const auto step = env("SLURM_STEP_ID") ? env("SLURM_STEP_ID") : env("SLURM_STEPID");
  if (!list || !job || !step) return;  // not enough to derive: the caller's error says what to set
  info.store_host = slurm::first_host(*list, list_name);
  info.store_port = slurm::store_port(*job, *step);
  info.rank0_serves_store = true;
  info.store_address_from = fmt::format(
      "the first node of {} and a port from SLURM_JOB_ID={} and SLURM_STEP_ID={}; set "
      "MASTER_ADDR and MASTER_PORT to choose them yourself",
      list_name, *job, *step);
  const auto node = env("SLURMD_NODENAME");
  LOCKSTEP_CHECK(info.rank != 0 || !node || *node == info.store_host,
                 "Slurm placed task 0 on node {}, not on the step's first node {} ({}={}), so "
                 "the other tasks would look for its store in the wrong place; set MASTER_ADDR "
                 "to task 0's host and MASTER_PORT to a free port on every task (e.g. in the "
                 "batch script, before srun)",
                 *node, info.store_host, list_name, *list);
}

void read_store_address(const EnvLookup& env, const Source* source, RankInfo& info) {
  // lockstep-run's address, or one set by hand for a store served elsewhere
  // (torchrun's workers ignore it: torchrun always gives MASTER_*).
  const auto addr = is(source, "torchrun") ? std::nullopt : env("LOCKSTEP_STORE_ADDR");
  if (addr) {
    std::tie(info.store_host, info.store_port) = parse_host_port(*addr, "LOCKSTEP_STORE_ADDR");
    info.store_address_from = "LOCKSTEP_STORE_ADDR";
    return;
  }
  if (is(source, "lockstep-run")) return;
  read_master(env, info);
  if (info.has_store_address()) {
    info.rank0_serves_store = true;
    info.store_address_from = "MASTER_ADDR/MASTER_PORT";
    if (is(source, "torchrun") && torchrun_agent_serves_master_port(env)) {
      const int agent_port = info.store_port;
      info.store_port = agent_port < 65535 ? agent_port + 1 : agent_port - 1;
      info.store_address_from = fmt::format(
          "MASTER_ADDR and the port next to MASTER_PORT={}, where torchrun's agent serves its "
          "own store; start torchrun with another --master_port to move both",
          agent_port);
    }
  } else if (is(source, "slurm") && info.world_size > 1) {
    read_slurm_store(env, info);
  }
}

// A token every rank of one launch derives alike, where the launcher gives
// no secret: it keeps another job's ranks out. Not from torchrun's
// TORCHELASTIC_RESTART_COUNT: each node's agent counts only the restarts its
// own workers' failures caused, so after one the nodes' counts differ.
std::string derived_token(const EnvLookup& env, const Source* source, const RankInfo& info) {
  std::string identity = fmt::format("{}|{}|{}|{}", source->name, info.world_size,
                                     info.store_host, info.store_port);
  const std::vector<const char*> names =
      is(source, "torchrun")
          ? std::vector<const char*>{"TORCHELASTIC_RUN_ID"}
          : std::vector<const char*>{"SLURM_CLUSTER_NAME", "SLURM_JOB_ID", "SLURM_STEP_ID"};
  for (const char* name : names) {
    identity += '|';
    identity += env(name).value_or("");
  }
  return fmt::format("{:016x}{:016x}", runtime::stable_hash(identity),
                     runtime::stable_hash(identity, 0x6c6f636b));
}

// Which variable to set for a missing store address, for the error message.
std::string store_hint(const Source& source) {
  if (std::string_view(source.name) == "lockstep-run") return "LOCKSTEP_STORE_ADDR=host:port";
  if (std::string_view(source.name) == "torchrun") return "MASTER_ADDR and MASTER_PORT";
  return "MASTER_ADDR and MASTER_PORT (rank 0 serves the store there) or "
         "LOCKSTEP_STORE_ADDR=host:port (a store served elsewhere)";
}

void read_settings(const EnvLookup& env, RankInfo& info) {
  if (auto token = env("LOCKSTEP_TOKEN")) info.token = *token;
  info.node_id = read_node_id(env);

  if (auto backend = env("LOCKSTEP_BACKEND")) {
    info.backend = lower(*backend);
    const bool ok = std::all_of(info.backend.begin(), info.backend.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '+';
    });
    LOCKSTEP_CHECK(ok, "LOCKSTEP_BACKEND={} is not a backend name; use e.g. gloo, mpi, nccl "
                   "or shm, or unset it for the default", runtime::quoted_value(*backend));
  }

  if (auto debug = env("LOCKSTEP_DEBUG")) {
    const std::string level = lower(*debug);
    if (level.empty() || level == "off" || level == "0") {
      info.debug = DebugLevel::Off;
    } else if (level == "info" || level == "1") {
      info.debug = DebugLevel::Info;
    } else if (level == "detail" || level == "2") {
      info.debug = DebugLevel::Detail;
    } else {
      throw Error(fmt::format("LOCKSTEP_DEBUG={} is not a debug level; use off, info or detail",
                              runtime::quoted_value(*debug)));
    }
  }

  info.timeout = runtime::read_seconds(env, "LOCKSTEP_TIMEOUT_S", "a timeout", 600);
  info.stall_report =
      runtime::read_seconds(env, "LOCKSTEP_STALL_REPORT_S", "a stall report interval", 60);
  info.restart_count = read_restart_count(env);
}

}  // namespace

bool every_rank_on_this_host(const RankInfo& info) {
  return info.local_world_size == info.world_size &&
         (info.local_world_size_given || names_loopback(info.store_host));
}

std::string address_for_peers(const RankInfo& info) {
  if (every_rank_on_this_host(info)) return "127.0.0.1";
  const std::string found = first_interface_ipv4();
  // No other host can reach this one: where the launcher did not say where
  // the ranks are, they are all here.
  if (found.empty() && !info.local_world_size_given) return "127.0.0.1";
  LOCKSTEP_CHECK(!found.empty(),
                 "rank 0 found no non-loopback IPv4 address for the other hosts to reach its "
                 "store; set LOCKSTEP_STORE_ADDR=host:port (or MASTER_ADDR and MASTER_PORT)");
  return found;
}

std::string read_node_id(const EnvLookup& env) {
  return env("LOCKSTEP_NODE_ID").value_or(std::string());
}

int read_restart_count(const EnvLookup& env) {
  return runtime::read_whole_number(env, "LOCKSTEP_RESTART_COUNT", 0).value_or(0);
}

std::string read_job_id(const EnvLookup& env) {
  const std::string id = env("LOCKSTEP_JOB_ID").value_or("");
  const bool ok = id.size() <= 128 && std::all_of(id.begin(), id.end(), [](char c) {
                    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ||
                           c == '.';
                  });
  LOCKSTEP_CHECK(ok, "LOCKSTEP_JOB_ID={} is not a job id (letters, digits, '-', '_' and '.', "
                 "at most 128); lockstep-run sets it: unset it to run without one",
                 runtime::quoted_value(id));
  return id;
}

std::optional<std::string> read_async_error_handling(const EnvLookup& env) {
  return env("LOCKSTEP_ASYNC_ERROR_HANDLING");
}

DeviceEnv read_device_env(const EnvLookup& env) {
  return {.device = env("LOCKSTEP_DEVICE"), .cuda_visible_devices = env("CUDA_VISIBLE_DEVICES")};
}

std::pair<std::string, int> parse_host_port(const std::string& text, const std::string& what) {
  std::string host;
  std::string port;
  if (!text.empty() && text.front() == '[') {
    // [IPv6]:port
    const auto close = text.find(']');
    LOCKSTEP_CHECK(close != std::string::npos && close + 1 < text.size() && text[close + 1] == ':',
                   "{}={} is not an address; write an IPv6 host as [addr]:port, "
                   "e.g. [::1]:29500", what, runtime::quoted_value(text));
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    LOCKSTEP_CHECK(colon != std::string::npos,
                   "{}={} has no port; write it as host:port, e.g. 127.0.0.1:29500", what,
                   runtime::quoted_value(text));
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    LOCKSTEP_CHECK(host.find(':') == std::string::npos,
                   "{}={} is ambiguous; write an IPv6 host in brackets, e.g. [::1]:29500",
                   what, runtime::quoted_value(text));
  }
  LOCKSTEP_CHECK(!host.empty(), "{}={} has no host; write it as host:port, e.g. "
                 "127.0.0.1:29500", what, runtime::quoted_value(text));
  int value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  LOCKSTEP_CHECK(!port.empty() && ec == std::errc() && end == port.data() + port.size() &&
                     value >= 1 && value <= 65535,
                 "{}={} has a bad port {}; the port must be a number from 1 to 65535",
                 what, runtime::quoted_value(text), runtime::quoted_value(port));
  return {host, value};
}

RankInfo read_rank_info(const EnvLookup& process, RankInfoOptions options) {
  RankInfo info;
  read_settings(process, info);

  const Source* source = find_source(process);
  refuse_unreadable_launcher(process, source);
  if (source == nullptr) {
    info.source = "none";
    read_store_address(process, source, info);
    return info;
  }

  info.source = source->name;
  // A rank of another build than its lockstep-run's would misread what the
  // launcher tells it (these variables, its heartbeats).
  if (is(source, "lockstep-run")) require_launcher_wire(process);
  const EnvLookup env = is(source, "slurm") ? slurm_view(process) : process;
  info.world_size = require_int(env, *source, source->world_size, 1);
  info.rank = require_int(env, *source, source->rank, 0);
  LOCKSTEP_CHECK(info.rank < info.world_size,
                 "{}={} is out of range: it must be less than {}={}; check the launcher's "
                 "variables", source->rank, info.rank, source->world_size, info.world_size);

  // Without local variables, assume one node: the local rank is the rank.
  // With a local world size alone, assume nodes of that size, as the node
  // rank below does.
  const auto local_rank = runtime::read_whole_number(env, source->local_rank, 0);
  const auto local_size = runtime::read_whole_number(env, source->local_world_size, 1);
  info.local_world_size = local_size.value_or(info.world_size);
  info.local_rank = local_rank.value_or(info.rank % info.local_world_size);
  info.local_world_size_given = local_size.has_value();
  if (local_size) {
    LOCKSTEP_CHECK(info.local_world_size <= info.world_size,
                   "{}={} is out of range: it must be at most {}={}", source->local_world_size,
                   info.local_world_size, source->world_size, info.world_size);
  }
  LOCKSTEP_CHECK(info.local_rank < info.local_world_size,
                 "{}={} is out of range: it must be less than {}={}", source->local_rank,
                 info.local_rank, local_size ? source->local_world_size : source->world_size,
                 info.local_world_size);

  // Node rank: the launcher's own where it has one, else from uniform nodes.
  const auto node_rank = runtime::read_whole_number(env, source->node_rank, 0);
  info.node_rank = node_rank.value_or(info.rank / info.local_world_size);
  if (node_rank) {
    LOCKSTEP_CHECK(info.node_rank < info.world_size,
                   "{}={} is out of range: there are only {} ranks", source->node_rank,
                   info.node_rank, info.world_size);
  }

  read_store_address(env, source, info);
  if (info.rank0_serves_store && (is(source, "torchrun") || is(source, "slurm")) &&
      !env("LOCKSTEP_TOKEN"))
    info.token = derived_token(env, source, info);
  LOCKSTEP_CHECK(info.world_size == 1 || info.has_store_address() || options.allow_missing_store,
                 "{}={} but no store address is set, so the ranks cannot find each other; "
                 "set {}, or start the job with lockstep-run",
                 source->world_size, info.world_size, store_hint(*source));
  return info;
}

std::vector<std::pair<std::string, std::string>> rank_variables(const RankInfo& info,
                                                                int num_nodes,
                                                                std::optional<int> master_port) {
  const bool ipv6 = info.store_host.find(':') != std::string::npos;
  const std::string port = std::to_string(info.store_port);
  const std::string addr =
      ipv6 ? "[" + info.store_host + "]:" + port : info.store_host + ":" + port;
  std::vector<std::pair<std::string, std::string>> vars = {
      {"LOCKSTEP_RANK", std::to_string(info.rank)},
      {"LOCKSTEP_WORLD_SIZE", std::to_string(info.world_size)},
      {"LOCKSTEP_LOCAL_RANK", std::to_string(info.local_rank)},
      {"LOCKSTEP_LOCAL_WORLD_SIZE", std::to_string(info.local_world_size)},
      {"LOCKSTEP_NODE_RANK", std::to_string(info.node_rank)},
      {"LOCKSTEP_NUM_NODES", std::to_string(num_nodes)},
      {"LOCKSTEP_STORE_ADDR", addr},
      {"LOCKSTEP_TOKEN", info.token},
      {"RANK", std::to_string(info.rank)},
      {"WORLD_SIZE", std::to_string(info.world_size)},
      {"LOCAL_RANK", std::to_string(info.local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(info.local_world_size)},
  };
  if (master_port) {
    vars.emplace_back("MASTER_ADDR", info.store_host);
    vars.emplace_back("MASTER_PORT", std::to_string(*master_port));
  }
  return vars;
}

}  // namespace lockstep::distributed
