// The environment of one rank: the launcher's own, the user's -x exports,
// OMP_NUM_THREADS=1 unless set (and PYTHONUNBUFFERED=1 under --tag-output),
// then the rank variables (which always win).
#pragma once

#include <string>
#include <vector>

#include "launcher/options.h"

namespace lockstep::launcher {

struct RankSlot {
  int rank = 0;
  int local_rank = 0;
};

// Where the ranks reach the job's store.
struct StoreAddress {
  std::string host;  // IPv6 without brackets
  int port = 0;
  std::string token;
};

// How often a rank beats under --hang-timeout (LOCKSTEP_HEARTBEAT_MS).
int heartbeat_interval_ms(const Options& options);

// Global rank of a local rank: node_rank * nproc_per_node + local_rank.
RankSlot rank_slot(const Options& options, int local_rank);

// "NAME=value" entries; `base` is the launcher's environment in the same form.
// `master_port`: MASTER_PORT, the port on the store's host left free for the
// program's own rank 0 (program_port.h).
// `restart_count`: LOCKSTEP_RESTART_COUNT and torchrun's
// TORCHELASTIC_RESTART_COUNT, the attempt (0 the first time).
// `flight_recorder`: LOCKSTEP_FLIGHT_RECORDER, the file the rank records its
// collectives in (distributed/flight_recorder.h); empty: none.
// `job_id`: LOCKSTEP_JOB_ID, the same for every attempt of this launch (a
// restarted program continues the run its job started, not another one:
// train/training_run.h); empty: none.
std::vector<std::string> child_environment(const std::vector<std::string>& base,
                                           const Options& options, const RankSlot& slot,
                                           const StoreAddress& store, int master_port,
                                           int restart_count = 0,
                                           const std::string& flight_recorder = {},
                                           const std::string& job_id = {});

}  // namespace lockstep::launcher
