#include "launcher/descriptor_limit.h"

#include <sys/resource.h>

#include <fmt/format.h>

#include "lockstep/runtime/open_files.h"

namespace lockstep::launcher {
namespace {

// What the launcher opens for itself, with room to spare (about 8 are open
// at once): the signalfd, the store server's poll set, wakeup and listening
// socket, the reaper's pipe, the node link, the files the post-mortem reads.
constexpr long kOwnDescriptors = 16;

// The connections another node's launcher makes to node 0's store: its node
// link's three (calls, watching, beating) and its exit recorder's.
constexpr long kConnectionsPerOtherLauncher = 4;

// On node 0, which serves the job's store: a connection per rank of the job
// and per other node's launcher, and node 0's launcher's own (its exit
// recorder's, and its node link's two), which hold both ends here.
long store_descriptors(const Options& options) {
  if (options.node_rank != 0) return 0;
  const long own_connections = 1 + (options.nnodes > 1 ? 2 : 0);
  return static_cast<long>(options.world_size()) +
         kConnectionsPerOtherLauncher * (options.nnodes - 1) + 2 * own_connections;
}

// Descriptors open now: stdio and whatever the caller let the launcher
// inherit; 3 where /proc cannot tell.
long descriptors_open_now() {
  const long open = runtime::open_descriptors();
  return open < 0 ? 3 : open;
}

}  // namespace

long descriptors_needed(const Options& options) {
  const long per_local_rank = 1 + (options.tag_output ? 2 : 0);
  return descriptors_open_now() + kOwnDescriptors + per_local_rank * options.nproc_per_node +
         store_descriptors(options);
}

void ensure_descriptor_limit(const Options& options) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;  // unknown: start, and report what fails
  const auto needed = static_cast<rlim_t>(descriptors_needed(options));
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= needed) return;
  const rlim_t soft = limit.rlim_cur;
  const bool hard_suffices = limit.rlim_max == RLIM_INFINITY || limit.rlim_max >= needed;
  // The hard limit where it is finite (no later raise is needed), else what the job needs.
  limit.rlim_cur = limit.rlim_max == RLIM_INFINITY ? needed : limit.rlim_max;
  if (hard_suffices && setrlimit(RLIMIT_NOFILE, &limit) == 0) return;
  const bool one = options.nproc_per_node == 1;
  const bool serves_nodes = options.node_rank == 0 && options.nnodes > 1;
  throw UsageError(fmt::format(
      "{} on this node {} about {} open files in the launcher{}, but its limit is {} "
      "(ulimit -n) and {}: raise the limit (ulimit -Hn, or nofile in "
      "/etc/security/limits.conf){}",
      one ? std::string("1 rank") : fmt::format("{} ranks", options.nproc_per_node),
      one ? "needs" : "need", needed,
      serves_nodes ? fmt::format(" (it serves the job's store: a connection for each of the "
                                 "job's {} ranks and {} for each other node's launcher)",
                                 options.world_size(), kConnectionsPerOtherLauncher)
                   : std::string(),
      soft,
      hard_suffices ? std::string("raising it failed")
                    : fmt::format("the hard limit is {}", limit.rlim_max),
      one ? "" : " or start fewer ranks per node"));
}

}  // namespace lockstep::launcher
