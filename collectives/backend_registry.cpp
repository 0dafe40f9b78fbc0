#include "lockstep/collectives/backend_registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>

#include "lockstep/collectives/backends.h"
#include "lockstep/collectives/hierarchical_group.h"
#include "lockstep/collectives/shm/shm_group.h"
#include "lockstep/config.h"
#include "lockstep/distributed/store/prefix_store.h"
#include "lockstep/distributed/store/tcp_store.h"

#if LOCKSTEP_HAVE_GLOO
#include "lockstep/collectives/gloo/gloo_group.h"
#endif
#if LOCKSTEP_HAVE_MPI
#include "lockstep/collectives/mpi/mpi_group.h"
#endif
#if LOCKSTEP_HAVE_NCCL
#include "lockstep/collectives/nccl/nccl_group.h"
#endif
#if LOCKSTEP_HAVE_CUDA
#include "lockstep/collectives/cuda_staging/staging_group.h"
#endif

namespace lockstep::collectives {
namespace {

// shm within each node, gloo across nodes (hierarchical_group.h).
constexpr std::string_view kHierarchical = "shm+gloo";

using Factory = std::shared_ptr<ProcessGroup> (*)(const GroupArgs&);

struct Entry {
  std::string_view name;
  Factory make;  // null: not built in
};

#if LOCKSTEP_HAVE_GLOO
// Where gloo listens: the interface this rank reaches the store through, so
// that peers on other hosts can reach it too.
std::string bind_address_of(const std::shared_ptr<distributed::Store>& store) {
  std::shared_ptr<distributed::Store> s = store;
  while (auto prefix = std::dynamic_pointer_cast<distributed::PrefixStore>(s)) s = prefix->inner();
  if (auto tcp = std::dynamic_pointer_cast<distributed::TcpStore>(s)) return tcp->local_address();
  return "127.0.0.1";
}

std::shared_ptr<ProcessGroup> make_gloo(const GroupArgs& a) {
  return make_gloo_group(a.store, a.rank, a.size, a.name, a.timeout, bind_address_of(a.store));
}

// This rank's node when the caller names none: LOCKSTEP_NODE_ID where set, as
// init_process_group() reads it, so every group of a job sees the same nodes.
std::string node_key_from_env() {
  distributed::RankInfo info;
  info.node_id = distributed::read_node_id();
  return this_node_key(info);
}

std::shared_ptr<ProcessGroup> make_hierarchical(const GroupArgs& a) {
  LOCKSTEP_CHECK(a.store != nullptr, "group '{}' (shm+gloo) needs a store to find each rank's node",
                 a.name);
  const NodeTopology topology =
      a.topology != nullptr
          ? *a.topology
          : discover_topology(*a.store, a.rank, a.size, a.name,
                              a.node_key.empty() ? node_key_from_env() : a.node_key, a.timeout);
  return make_hierarchical_group(a.store, a.rank, a.size, a.name, a.timeout, topology);
}
#endif

#if LOCKSTEP_HAVE_MPI
std::shared_ptr<ProcessGroup> make_mpi(const GroupArgs& a) {
  return make_mpi_group(a.rank, a.size, a.name, a.timeout);
}
#endif

#if LOCKSTEP_HAVE_NCCL
std::shared_ptr<ProcessGroup> make_nccl(const GroupArgs& a) {
  return make_nccl_group(a.store, a.rank, a.size, a.name, a.timeout, {.device = a.device});
}
#endif

std::shared_ptr<ProcessGroup> make_shm(const GroupArgs& a) {
  return make_shm_group(a.store, a.rank, a.size, a.name, a.timeout);
}

constexpr std::array<Entry, 5> kRegistry{{
#if LOCKSTEP_HAVE_GLOO
    {"gloo", &make_gloo},
    {kHierarchical, &make_hierarchical},
#else
    {"gloo", nullptr},
    {kHierarchical, nullptr},
#endif
#if LOCKSTEP_HAVE_MPI
    {"mpi", &make_mpi},
#else
    {"mpi", nullptr},
#endif
#if LOCKSTEP_HAVE_NCCL
    {"nccl", &make_nccl},
#else
    {"nccl", nullptr},
#endif
    {"shm", &make_shm},
}};

}  // namespace

void require_backend(std::string_view backend) {
  if (backend == kHierarchical) {  // shm is always built in; gloo may not be
    LOCKSTEP_CHECK(is_built_in("gloo"),
                   "collectives backend 'shm+gloo' (shared memory within each node, gloo "
                   "across nodes: the default when the ranks span several nodes) needs gloo, "
                   "which is not built into this lockstep; {}; or choose another backend with "
                   "LOCKSTEP_BACKEND or InitOptions::backend (e.g. mpi)",
                   how_to_enable("gloo"));
    return;
  }
  const auto built_in = built_in_backends();
  const bool known = std::any_of(kRegistry.begin(), kRegistry.end(),
                                 [&](const Entry& e) { return e.name == backend; });
  if (!known) {
    std::vector<std::string> usable = built_in;
    if (is_built_in("gloo")) usable.emplace_back(kHierarchical);
    throw Error(fmt::format(
        "unknown collectives backend '{}'; the backends are gloo, mpi, nccl, shm and {} (built "
        "into this lockstep: {}); name one of them with LOCKSTEP_BACKEND or "
        "InitOptions::backend, or leave both unset for the default",
        backend, kHierarchical, fmt::join(usable, ", ")));
  }
  const std::string how = how_to_enable(backend);
  LOCKSTEP_CHECK(
      is_built_in(backend),
      "collectives backend '{}' is not built into this lockstep (built in: {}); {}", backend,
      built_in.empty() ? std::string("none") : fmt::format("{}", fmt::join(built_in, ", ")), how);
}

std::shared_ptr<ProcessGroup> make_backend_group(std::string_view backend, const GroupArgs& args) {
  require_backend(backend);
  for (const Entry& entry : kRegistry) {
    if (entry.name == backend && entry.make != nullptr) return entry.make(args);
  }
  throw Error(fmt::format("collectives backend '{}' is built in but has no factory", backend));
}

std::shared_ptr<ProcessGroup> with_device_staging(std::shared_ptr<ProcessGroup> group,
                                                  std::string_view backend) {
#if LOCKSTEP_HAVE_CUDA
  if (backend != "nccl") return make_cuda_staging_group(std::move(group));
#else
  (void)backend;
#endif
  return group;
}

}  // namespace lockstep::collectives
