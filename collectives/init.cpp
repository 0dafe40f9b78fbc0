#include "lockstep/collectives/init.h"

#include <unistd.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lockstep/collectives/backend_choice.h"
#include "lockstep/collectives/backend_registry.h"
#include "lockstep/collectives/build_identity.h"
#include "lockstep/collectives/backends.h"
#include "lockstep/collectives/debug_group.h"
#include "lockstep/collectives/new_group.h"
#include "lockstep/collectives/owned_by_process.h"
#include "lockstep/collectives/node_topology.h"
#include "lockstep/config.h"
#include "lockstep/runtime/cuda/core/error_context.h"
#include "lockstep/distributed/device_select.h"
#include "lockstep/distributed/exited_ranks.h"
#include "lockstep/runtime/device_backend.h"
#include "lockstep/runtime/liveness.h"
#include "lockstep/runtime/standard_streams.h"
#include "lockstep/distributed/store/listen_address.h"
#include "lockstep/distributed/store/memory_store.h"
#include "lockstep/distributed/store/prefix_store.h"
#include "lockstep/distributed/store/tcp_store.h"

#if LOCKSTEP_HAVE_MPI
#include "lockstep/collectives/mpi/mpi_runtime.h"
#endif

namespace lockstep::collectives {
namespace {

using std::chrono::milliseconds;

// What the returned group keeps alive: the store server rank 0 may run, the
// store, and the group itself (destroyed first, the server last).
struct GroupHolder {
  std::shared_ptr<distributed::TcpStoreServer> server;
  std::shared_ptr<distributed::Store> store;
  std::shared_ptr<ProcessGroup> group;
};

// This process, as the other ranks' errors name it: host and pid, and a
// random tag because pids repeat across containers and hosts' names can.
const std::string& this_process() {
  static const std::string name = [] {
    std::random_device random;
    return fmt::format("{} pid {} (tag {:08x})", host_name(), ::getpid(), random());
  }();
  return name;
}

// One process per rank of a group on one store. Two jobs given the same
// store address and token (two Slurm clusters whose job and step ids
// coincide, a MASTER_PORT reused) or a rank started twice would otherwise
// share the store's keys and wait on each other's values without end. The
// first process to claim the rank keeps it (a group made again by the same
// process claims it again); any other fails here, before it touches a key.
void claim_rank(distributed::Store& store, const std::string& group, int rank) {
  const std::string key = fmt::format("{}/rank-owner/{}", group, rank);
  const std::string owner = distributed::to_string(
      store.compare_set(key, {}, distributed::to_bytes(this_process())));
  if (owner == this_process()) return;
  throw Error(fmt::format(
      "rank {} of group '{}' is already taken on this store by {}; this process ({}) is a "
      "second rank {}: two jobs were given the same store address (and token), or one rank "
      "was started twice. Give each job its own MASTER_ADDR:MASTER_PORT (under Slurm, its own "
      "job and step, or set them before srun) and start every rank once",
      rank, group, owner, this_process(), rank));
}

// A rank's client; while the store is not there yet it says so every stall
// report interval (LOCKSTEP_STALL_REPORT_S), naming the rank and where the
// address came from.
std::shared_ptr<distributed::TcpStore> connect_store(const distributed::RankInfo& info,
                                                 const std::string& host, int port,
                                                 const std::string& token, milliseconds timeout) {
  distributed::TcpStoreOptions options;
  options.host = host;
  options.port = static_cast<uint16_t>(port);
  options.token = token;
  options.connect_timeout = timeout;
  options.timeout = timeout;
  options.report_waiting_every = info.stall_report.value_or(std::chrono::minutes(1));
  options.who = fmt::format("rank {} of {} (from {}{})", info.rank, info.world_size, info.source,
                            info.store_address_from.empty()
                                ? ""
                                : "; store address from " + info.store_address_from);
  return std::make_shared<distributed::TcpStore>(options);
}

// Serves the job's store for its `ranks` clients.
std::shared_ptr<distributed::TcpStoreServer> serve_store(const std::string& host, uint16_t port,
                                                     const std::string& token, int ranks) {
  distributed::TcpStoreServerOptions options;
  options.host = host;
  options.port = port;
  options.token = token;
  options.expected_clients = static_cast<uint32_t>(ranks);
  return std::make_shared<distributed::TcpStoreServer>(options);
}

// Rank 0's servers at the job's address, one per address and token, each kept
// from the first group that needs it to the end of the process, as
// lockstep-run keeps its store for the whole job. A second group (another
// name beside "default", as PyTorch's new_group) or a group made again would
// otherwise listen again on the port the first holds; and a rank that makes
// its next group while rank 0 still holds the last one (rank 0 saving a
// checkpoint) connects to that group's server: one that closed with rank 0's
// last group lost that rank's keys and connection, and rank 0's next group,
// on a new server, waited for a rank that had published on the old one.
// Keyed by pid as well: a forked child has the map but not the servers'
// threads, so it leaves its parent's servers alone at exit.
class JobStoreServers {
 public:
  ~JobStoreServers() {
    // A parent's servers, in a forked child: kept, reachable, never destroyed.
    static auto* inherited = new std::vector<std::shared_ptr<distributed::TcpStoreServer>>();
    for (auto& [key, entry] : serving_) {
      if (entry.pid != ::getpid()) inherited->push_back(std::move(entry.server));
    }
  }

  std::shared_ptr<distributed::TcpStoreServer> serve(const distributed::RankInfo& info) {
    const std::string key =
        fmt::format("{} {}:{} {}", ::getpid(), info.store_host, info.store_port, info.token);
    std::lock_guard lock(mutex_);
    Entry& entry = serving_[key];
    if (entry.server) return entry.server;
    const bool one_host = distributed::every_rank_on_this_host(info);
    entry = {::getpid(), serve_store(distributed::listen_host_for(info.store_host, one_host),
                                     static_cast<uint16_t>(info.store_port), info.token,
                                     info.world_size)};
    return entry.server;
  }

 private:
  struct Entry {
    pid_t pid = 0;
    std::shared_ptr<distributed::TcpStoreServer> server;
  };
  std::mutex mutex_;
  std::map<std::string, Entry> serving_;
};

std::shared_ptr<distributed::TcpStoreServer> serve_job_store(const distributed::RankInfo& info) {
  static JobStoreServers servers;
  try {
    return servers.serve(info);
  } catch (const Error& e) {
    throw Error(fmt::format("rank 0 of {} (from {}) cannot serve the job's store at {}:{}, "
                            "taken from {}: {}",
                            info.world_size, info.source, info.store_host, info.store_port,
                            info.store_address_from, e.what()));
  }
}

// The job's store, as init.h describes; fills holder.server and holder.store.
void make_store(const distributed::RankInfo& info, milliseconds timeout, GroupHolder& holder) {
  if (info.has_store_address()) {
    if (info.rank0_serves_store && info.rank == 0) holder.server = serve_job_store(info);
    holder.store = connect_store(info, info.store_host, info.store_port, info.token, timeout);
    return;
  }
  if (info.world_size == 1) {
    holder.store = std::make_shared<distributed::MemoryStore>();
    return;
  }
  const bool mpi_source = info.source == "open-mpi" || info.source == "pmi";
  LOCKSTEP_CHECK(LOCKSTEP_HAVE_MPI && mpi_source,
                 "rank {} of {} (from {}) has no store address: run under lockstep-run, set "
                 "LOCKSTEP_STORE_ADDR=host:port (or MASTER_ADDR and MASTER_PORT), or pass "
                 "InitOptions::store",
                 info.rank, info.world_size, info.source);
#if LOCKSTEP_HAVE_MPI
  // Under mpirun with no address: rank 0 serves on a free port and tells the
  // others "host:port:token" through MPI.
  mpi::ensure_mpi_initialized();
  std::string shared;
  if (info.rank == 0) {
    const std::string token = distributed::random_token();
    holder.server = serve_store("0.0.0.0", 0, token, info.world_size);
    shared = fmt::format("{}:{}:{}", distributed::address_for_peers(info),
                         holder.server->port(), token);
  }
  shared = mpi::broadcast_string(shared, 0);
  const auto last = shared.rfind(':');
  const auto [host, port] =
      distributed::parse_host_port(shared.substr(0, last), "the store address from rank 0");
  holder.store = connect_store(info, host, port, shared.substr(last + 1), timeout);
#endif
}

distributed::RankInfo rank_info_from_env() {
  const auto env = runtime::process_env();
  if (!LOCKSTEP_HAVE_MPI) return distributed::read_rank_info(env);
  // Under mpirun rank 0 can provide the store itself; elsewhere a missing
  // address is an error, worded by read_rank_info.
  distributed::RankInfo info = distributed::read_rank_info(env, {.allow_missing_store = true});
  const bool mpi_source = info.source == "open-mpi" || info.source == "pmi";
  if (info.world_size > 1 && !info.has_store_address() && !mpi_source) {
    return distributed::read_rank_info(env);
  }
  return info;
}

// make_process_group() with, for shm+gloo, the topology when the caller
// already has it (else it is discovered with `node_key`), the stall report
// interval, and for nccl the device (-1: the calling thread's current one).
std::shared_ptr<ProcessGroup> make_group(const std::string& backend,
                                         std::shared_ptr<distributed::Store> store, int rank,
                                         int size, const std::string& name, milliseconds timeout,
                                         distributed::DebugLevel debug, const NodeTopology* topology,
                                         const std::string& node_key,
                                         std::optional<milliseconds> stall_report = {},
                                         int device = -1) {
  std::shared_ptr<ProcessGroup> group = make_backend_group(
      backend, {.store = store, .rank = rank, .size = size, .name = name, .timeout = timeout,
                .topology = topology, .node_key = node_key, .device = device});
  if (stall_report) group->report_stalls_after(*stall_report);
  group = with_device_staging(std::move(group), backend);
  if (debug == distributed::DebugLevel::Detail) {
    LOCKSTEP_CHECK(store != nullptr,
                   "LOCKSTEP_DEBUG=detail on group '{}' needs a store to compare the ranks' calls",
                   name);
    group = make_debug_group(std::move(group), std::move(store));
  }
  return group;
}

}  // namespace

std::shared_ptr<ProcessGroup> init_process_group(InitOptions options) {
  // Before the store's socket, which would otherwise take a closed stdout's number.
  runtime::open_closed_standard_streams();
  const distributed::RankInfo info = options.rank_info ? *options.rank_info : rank_info_from_env();
  // Under lockstep-run: beats that tell it this rank is alive (runtime/liveness.h).
  runtime::start_heartbeats();
  std::string backend = !options.backend.empty() ? options.backend : info.backend;
  // A backend asked for is checked before connecting; the default needs the store.
  if (!backend.empty()) require_backend(backend);
  const milliseconds timeout =
      options.timeout.value_or(info.timeout.value_or(ProcessGroup::kDefaultTimeout));

  auto holder = std::make_shared<GroupHolder>();
  if (options.store) {
    holder->store = options.store;
  } else {
    make_store(info, timeout, *holder);
    // A restarted job's ranks meet on the launcher's store, which still holds
    // the keys of the attempts before (rank claims, addresses, counters).
    if (info.restart_count > 0)
      holder->store = std::make_shared<distributed::PrefixStore>(
          distributed::attempt_prefix(info.restart_count), holder->store);
  }
  claim_rank(*holder->store, options.name, info.rank);
  int rank = info.rank;
  int size = info.world_size;
  const std::string node_key = this_node_key(info);
  // Every rank's build, backend asked for, device, GPU identity and node key, in one
  // exchange (backend_choice.h's format_placement). Ranks that ask for
  // different backends fail here rather than each waiting for the others in
  // its own backend's rendezvous until the timeout.
  PublishedPlacement mine{
      .asked = backend, .placement = {.node = node_key}, .build = this_build()};
  const runtime::Device device =
      options.device.value_or(distributed::selected_device().value_or(runtime::Device::cpu()));
  if (backend.empty()) {
    mine.placement.device = device;
    // Ranks that each see their own GPU as cuda:0 are told apart by it.
    if (device.is_cuda())
      mine.placement.gpu_id = runtime::device_backend(device).physical_id(device);
  }
  std::vector<std::string> asked, node_keys, builds;
  std::vector<RankPlacement> placements;
  for (const std::string& value : exchange_through_store(
           *holder->store, rank, size, options.name, "placement", format_placement(mine),
           "backend, node and device", timeout, /*watch_exits=*/true)) {
    PublishedPlacement entry = parse_placement(value);
    asked.push_back(std::move(entry.asked));
    builds.push_back(std::move(entry.build));
    node_keys.push_back(entry.placement.node);
    placements.push_back(std::move(entry.placement));
  }
  // Ranks of different builds would pair bytes they read differently (or
  // choose different default backends): every rank refuses the group here.
  require_same_build(builds, node_keys, options.name,
                     std::any_of(asked.begin(), asked.end(),
                                 [](const std::string& a) { return a.empty(); }));
  backend = agreed_backend(asked, options.name);
  const NodeTopology topology = topology_from_keys(node_keys, rank);
  if (backend.empty()) {
    // The default, from every rank's node and device (backend_choice.h).
    const BackendChoice choice = choose_default_backend(placements, is_built_in("nccl"));
    if (!choice.note.empty() && rank == 0)
      std::fprintf(stderr, "lockstep: group '%s': %s\n", options.name.c_str(), choice.note.c_str());
    backend = choice.backend;
  }
  // The mpi backend keeps the launcher's rank and size: make_mpi_group refuses
  // an MPI world that is not this job (a process lockstep-run, spawn or
  // torchrun started is a one-process MPI world of its own).
  // CUDA, cuBLAS, cuDNN and NCCL errors name this rank from now on.
  runtime::cuda::set_process_rank(rank);
  // The device the placement named: a thread whose current device is another
  // (InitOptions::device given, select_device() not called) would otherwise
  // put the communicator there, two ranks' on one GPU.
  holder->group = make_group(backend, holder->store, rank, size, options.name, timeout, info.debug,
                             &topology, node_key, info.stall_report,
                             device.is_cuda() ? device.index : -1);
  ProcessGroup* group = holder->group.get();
  std::shared_ptr<distributed::Store> store = holder->store;
  std::shared_ptr<ProcessGroup> owned = owned_by_this_process(std::move(holder), group);
  remember_group_store(owned, std::move(store), info.debug);
  return owned;
}

std::shared_ptr<ProcessGroup> make_process_group(const std::string& backend,
                                                 std::shared_ptr<distributed::Store> store, int rank,
                                                 int size, const std::string& name,
                                                 milliseconds timeout, distributed::DebugLevel debug,
                                                 const std::string& node_key) {
  std::shared_ptr<ProcessGroup> group =
      make_group(backend, store, rank, size, name, timeout, debug, nullptr, node_key);
  ProcessGroup* raw = group.get();
  std::shared_ptr<ProcessGroup> owned = owned_by_this_process(std::move(group), raw);
  remember_group_store(owned, std::move(store), debug);
  return owned;
}

}  // namespace lockstep::collectives
