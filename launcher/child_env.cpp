#include "launcher/child_env.h"

#include <algorithm>
#include <map>

#include "launcher/spawn.h"
#include "lockstep/config.h"
#include "lockstep/distributed/launch_env.h"
#include "lockstep/distributed/wire_protocol.h"

namespace lockstep::launcher {

int heartbeat_interval_ms(const Options& options) {
  // Several beats per timeout, at most one a second.
  const double ms = options.hang_timeout_s * 1000.0 / 5.0;
  return static_cast<int>(std::clamp(ms, 20.0, 1000.0));
}

RankSlot rank_slot(const Options& options, int local_rank) {
  return {options.node_rank * options.nproc_per_node + local_rank, local_rank};
}

std::vector<std::string> child_environment(const std::vector<std::string>& base,
                                           const Options& options, const RankSlot& slot,
                                           const StoreAddress& store, int master_port,
                                           int restart_count,
                                           const std::string& flight_recorder,
                                           const std::string& job_id) {
  std::map<std::string, std::string> vars;
  for (const auto& entry : base) {
    const auto eq = entry.find('=');
    if (eq != std::string::npos) vars[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  // An outer torchrun's run (lockstep-run started by one of its workers) is
  // not this launch: it would have a PyTorch rank take its restart count for
  // this job's and lockstep's rank post-mortems name that run.
  vars.erase("TORCHELASTIC_RUN_ID");
  for (const auto& [name, value] : options.exports) vars[name] = value;
  // Ranks, not BLAS threads, use the cores (DESIGN.md, performance habits).
  vars.try_emplace("OMP_NUM_THREADS", "1");
  // --tag-output puts a pipe where the ranks had the launcher's stdout (a
  // terminal, line-buffered): Python would hold a rank's prints until 8 KiB
  // or its exit, after its tracebacks, and lose them when it is stopped.
  if (options.tag_output) vars.try_emplace("PYTHONUNBUFFERED", "1");

  distributed::RankInfo info;
  info.rank = slot.rank;
  info.world_size = options.world_size();
  info.local_rank = slot.local_rank;
  info.local_world_size = options.nproc_per_node;
  info.node_rank = options.node_rank;
  info.store_host = store.host;
  info.store_port = store.port;
  info.token = store.token;
  for (auto& [name, value] : distributed::rank_variables(info, options.nnodes, master_port))
    vars[name] = value;
  vars["LOCKSTEP_RESTART_COUNT"] = std::to_string(restart_count);
  // The rank's lockstep checks that it speaks this launcher's protocol.
  vars[distributed::kLauncherWireVar] = std::to_string(distributed::kWireProtocol);
  vars[distributed::kLauncherVersionVar] = LOCKSTEP_VERSION_STRING;
  // The rest of what torchrun --standalone gives a worker, for a program
  // written for it: its node (GROUP_*) and role (one role: every rank), and
  // its restarts (a script resumes from its checkpoint when the count is
  // not 0). Its rank 0 serves its own store at MASTER_PORT, as there.
  vars["GROUP_RANK"] = std::to_string(options.node_rank);
  vars["GROUP_WORLD_SIZE"] = std::to_string(options.nnodes);
  vars["ROLE_NAME"] = "default";
  vars["ROLE_RANK"] = std::to_string(slot.rank);
  vars["ROLE_WORLD_SIZE"] = std::to_string(options.world_size());
  vars["TORCHELASTIC_RESTART_COUNT"] = std::to_string(restart_count);
  vars["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(options.max_restarts);
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  // Not an outer launcher's job: this launch is a job of its own.
  if (job_id.empty()) {
    vars.erase("LOCKSTEP_JOB_ID");
  } else {
    vars["LOCKSTEP_JOB_ID"] = job_id;
  }
  if (options.hang_timeout_s > 0) {
    vars["LOCKSTEP_HEARTBEAT_FD"] = std::to_string(kChildHeartbeatFd);
    vars["LOCKSTEP_HEARTBEAT_MS"] = std::to_string(heartbeat_interval_ms(options));
  } else {
    vars.erase("LOCKSTEP_HEARTBEAT_FD");  // a launcher's own, from an outer launcher
  }

  // Not an outer launcher's file: that one belongs to the rank that started us.
  if (flight_recorder.empty()) {
    vars.erase("LOCKSTEP_FLIGHT_RECORDER");
  } else {
    vars["LOCKSTEP_FLIGHT_RECORDER"] = flight_recorder;
  }

  std::vector<std::string> out;
  out.reserve(vars.size());
  for (const auto& [name, value] : vars) out.push_back(name + "=" + value);
  return out;
}

}  // namespace lockstep::launcher
