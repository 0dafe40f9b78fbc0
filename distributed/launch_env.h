// distributed/launch_env: what the launcher tells each process, read from its
// environment through runtime/env.h's readers.
//
// Rank, world size, local rank, local world size and the store address come
// from the first launcher whose rank variable is set, in this order (a world
// size alone counts only where no rank is: a batch script may export
// WORLD_SIZE for all its srun's tasks):
//
//   lockstep-run   LOCKSTEP_RANK, LOCKSTEP_WORLD_SIZE, LOCKSTEP_LOCAL_RANK,
//                  LOCKSTEP_LOCAL_WORLD_SIZE, LOCKSTEP_NODE_RANK,
//                  LOCKSTEP_STORE_ADDR (host:port), LOCKSTEP_TOKEN
//   torchrun       RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
//                  MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE,
//                  TORCHELASTIC_RUN_ID
//   Open MPI       OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   MPICH / PMI    PMI_RANK, PMI_SIZE (local rank and size: Cray's PMI's
//                  PMI_LOCAL_RANK, PMI_LOCAL_SIZE where set, else hydra's
//                  MPI_LOCALRANKID, MPI_LOCALNRANKS); not where Slurm set them for
//                  its own step (srun --mpi=pmi2: PMI_JOBID=<job>.<step>, and
//                  PMI_RANK and PMI_SIZE Slurm's own): those tasks are read as
//                  Slurm's. An mpiexec in such a task keeps its PMI_JOBID but
//                  gives other ranks and sizes: its ranks are PMI's
//   Slurm (srun)   SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS),
//                  SLURM_LOCALID, SLURM_NODEID, and the local size from
//                  SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE, else
//                  SLURM_NTASKS_PER_NODE). Only a task of a step counts: one
//                  with SLURM_STEP_ID. A batch script's shell has SLURM_PROCID=0
//                  and SLURM_NTASKS=N too, and a program it runs before srun
//                  is one process.
//   PMIx           PMIX_RANK, PMIX_SIZE, PMIX_LOCAL_RANK, PMIX_LOCAL_SIZE
//   none           one process: rank 0 of world size 1
// Refused, as every process would be rank 0 of 1: hydra's port mode
// (mpiexec -pmi-port: PMI_PORT and PMI_ID, no PMI_RANK), and a PMIx launcher
// other than Slurm's (PMIX_NAMESPACE not slurm.pmix.*) inside a Slurm task.
//
// Who serves the store, and where (RankInfo::rank0_serves_store):
//   - lockstep-run serves it and passes LOCKSTEP_STORE_ADDR. Set by hand
//     under any other launcher, LOCKSTEP_STORE_ADDR also names a store that
//     something else serves: every rank only connects.
//   - MASTER_ADDR/MASTER_PORT (torchrun's, or set by hand under any launcher,
//     as PyTorch reads them): rank 0 serves there. Under torchrun's default
//     (static) rendezvous its agent already serves its own store on
//     MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True), so rank 0 serves on
//     the next port, MASTER_PORT+1 (MASTER_PORT-1 for 65535).
//   - Slurm without either: rank 0 serves on the first host of
//     SLURM_STEP_NODELIST (where Slurm puts task 0), on a port from
//     SLURM_JOB_ID and SLURM_STEP_ID (env_slurm.h).
//   - Open MPI / PMI without either, with MPI built in: rank 0 serves on a
//     free port and shares its address through MPI (see collectives/init.h).
//
// The token: LOCKSTEP_TOKEN where set. Otherwise, under torchrun and Slurm,
// one every rank derives from the job's identity (torchrun's run id and
// address; Slurm's job and step ids): it keeps ranks of another job out of
// this one's store, but it is no secret. (torchrun stops every worker before
// it starts the next attempt, whose store is new.) Set
// LOCKSTEP_TOKEN to a secret on every rank to authenticate the store.
//
// Other variables read here: LOCKSTEP_BACKEND (collectives backend to use,
// e.g. "gloo" or "mpi"), LOCKSTEP_DEVICE (the device each rank computes on
// unless the program says: auto, cpu, cuda or cuda:N; see
// distributed/device_select.h) with CUDA_VISIBLE_DEVICES (read for messages only:
// CUDA applies it itself), LOCKSTEP_ASYNC_ERROR_HANDLING (end-process or
// fail-works; collectives/async_error.h), LOCKSTEP_DEBUG ("off", "info" or "detail"),
// LOCKSTEP_TIMEOUT_S (default collective timeout in seconds),
// LOCKSTEP_STALL_REPORT_S (seconds a collective waits for other ranks before
// it prints one line saying for whom, and a rank connecting to a store that
// is not there yet between lines saying so; default 60), LOCKSTEP_NODE_ID (overrides this rank's
// node identity, which is otherwise the host name and boot id: ranks with the
// same value count as one node, e.g. for containers sharing a host, or to
// make one machine look like several nodes in tests; see
// collectives/node_topology.h), LOCKSTEP_RESTART_COUNT and LOCKSTEP_JOB_ID
// (which attempt of which lockstep-run launch this is; see below).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/runtime/env.h"

namespace lockstep::distributed {

using runtime::EnvLookup;
using runtime::process_env;

enum class DebugLevel { Off, Info, Detail };

struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  // Whether the launcher gave the local world size; else one node is assumed.
  bool local_world_size_given = false;
  int node_rank = 0;
  std::string store_host;  // empty: no store address was given
  int store_port = 0;
  std::string token;       // the store token; may be empty
  // Whether this job's rank 0 serves the store at store_host:store_port (else
  // a launcher or another program does, and every rank only connects).
  bool rank0_serves_store = false;
  // Where the address came from, for errors: e.g. "MASTER_ADDR/MASTER_PORT".
  std::string store_address_from;
  std::string source;      // "lockstep-run", "torchrun", "open-mpi", "pmi", "slurm", "pmix" or "none"
  std::string backend;     // LOCKSTEP_BACKEND; empty: the default
  DebugLevel debug = DebugLevel::Off;
  std::optional<std::chrono::milliseconds> timeout;  // LOCKSTEP_TIMEOUT_S
  std::optional<std::chrono::milliseconds> stall_report;  // LOCKSTEP_STALL_REPORT_S
  std::string node_id;     // LOCKSTEP_NODE_ID; empty: the host's own identity
  // LOCKSTEP_RESTART_COUNT: how many times lockstep-run --max-restarts has
  // started this job's ranks again (0 the first time). The ranks of attempt
  // N > 0 keep their store keys under "restart-N/", clear of the keys the
  // ranks of earlier attempts left in the launcher's store.
  int restart_count = 0;

  bool has_store_address() const { return !store_host.empty(); }
};

// Whether every rank runs on this host, so rank 0's store may listen on a
// loopback address: the launcher says so (its local world size is the
// world's), or the store's address can only mean this host (names_loopback).
// A host name this machine maps to loopback, in a job whose launcher gave no
// local sizes, may be several hosts' job: listen where the others reach it.
bool every_rank_on_this_host(const RankInfo& info);

// Where the other ranks reach a store rank 0 serves on this host when the
// launcher gave no address (under mpirun): 127.0.0.1 when every rank is on
// this host, else this host's first non-loopback IPv4 address (without
// one, 127.0.0.1 where the launcher gave no local sizes; else it throws,
// saying what to set). Without local sizes ranks may be on several hosts.
std::string address_for_peers(const RankInfo& info);

struct RankInfoOptions {
  // Accept world size > 1 without a store address (the caller will get one
  // some other way, e.g. from rank 0 through MPI).
  bool allow_missing_store = false;
};

// Reads and validates. Throws lockstep::Error naming the variable when a value
// is not a number, negative, out of range (rank >= world size, local rank >=
// local world size), or when world size > 1 has no store address (unless
// allowed), saying what to set.
RankInfo read_rank_info(const EnvLookup& env = process_env(), RankInfoOptions options = {});

// LOCKSTEP_NODE_ID (RankInfo::node_id); empty when unset.
std::string read_node_id(const EnvLookup& env = process_env());

// LOCKSTEP_RESTART_COUNT (RankInfo::restart_count): 0 when unset; throws
// naming the variable when it is not a whole number >= 0.
int read_restart_count(const EnvLookup& env = process_env());

// LOCKSTEP_JOB_ID: lockstep-run's id of this launch, the same for all its
// ranks and --max-restarts attempts (train::TrainingRunOptions::job ties a
// run's checkpoints to it); empty when unset. Throws naming the variable
// when it holds anything but letters, digits, '-', '_' and '.' (at most 128).
std::string read_job_id(const EnvLookup& env = process_env());

// LOCKSTEP_ASYNC_ERROR_HANDLING (what a collective that fails with no caller
// waiting does to the process: collectives/async_error.h); nullopt when unset.
std::optional<std::string> read_async_error_handling(const EnvLookup& env = process_env());

// LOCKSTEP_DEVICE and CUDA_VISIBLE_DEVICES, each nullopt when unset.
// device_select.h checks the request and names the variable in its errors.
struct DeviceEnv {
  std::optional<std::string> device;
  std::optional<std::string> cuda_visible_devices;
};
DeviceEnv read_device_env(const EnvLookup& env = process_env());

// The variables a launcher gives one rank, which read_rank_info() reads back
// as lockstep-run's: rank, sizes and node rank from `info`, the store at
// info.store_host:store_port (IPv6 without brackets) with info.token, and
// the sizes and ranks under torchrun's names for programs that read those.
// With `master_port`, also torchrun's MASTER_ADDR (the store's host) and
// MASTER_PORT: a port there left free for such a program's own rank 0 to
// serve its store on, as torchrun --standalone leaves it (lockstep's ranks
// read LOCKSTEP_STORE_ADDR instead).
std::vector<std::pair<std::string, std::string>> rank_variables(
    const RankInfo& info, int num_nodes, std::optional<int> master_port = std::nullopt);

// "host:port" -> (host, port); throws naming `what` (the variable) when malformed.
std::pair<std::string, int> parse_host_port(const std::string& text, const std::string& what);

}  // namespace lockstep::distributed
