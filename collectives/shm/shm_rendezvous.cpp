#include "lockstep/collectives/shm/shm_rendezvous.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace lockstep::collectives::shm {
namespace {

std::string new_segment_name() {
  static std::atomic<uint64_t> serial{0};
  return fmt::format("/{}{}-{}", segment_prefix(), ::getpid(), serial++);
}

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

}  // namespace

std::string rendezvous_prefix(distributed::Store& store, const std::string& name, int rank) {
  const int64_t instance = store.add(fmt::format("{}/shm/instances/{}", name, rank), 1);
  return fmt::format("{}/shm/{}/", name, instance);
}

namespace {

// Why a rank has no group segment, with the way around shared memory.
std::string no_segment(const std::string& name, const std::string& why) {
  return fmt::format(
      "shm group '{}': rank 0 could not create the shared segment: {}; or do without shared "
      "memory: LOCKSTEP_BACKEND=gloo works over loopback TCP (slower on one node)",
      name, why);
}

}  // namespace

std::unique_ptr<Comm> join_group(distributed::Store& store, const std::string& prefix,
                                 const std::string& name, int rank, int size,
                                 std::chrono::milliseconds timeout, size_t buffer_bytes,
                                 std::chrono::microseconds spin) {
  std::unique_ptr<Comm> comm;
  if (rank == 0) {
    const std::string segment_name = new_segment_name();
    try {
      comm = std::make_unique<Comm>(
          Segment::create(segment_name, Comm::segment_bytes(size, buffer_bytes)), 0, size,
          buffer_bytes, spin, true);
    } catch (const std::exception& e) {
      store.set(prefix + "segment", fmt::format("error {}", e.what()));
      throw Error(no_segment(name, e.what()));
    }
    store.set(prefix + "segment", fmt::format("{} {} {}", segment_name, buffer_bytes, host_name()));
    std::vector<std::string> keys;
    for (int q = 1; q < size; ++q) keys.push_back(fmt::format("{}attached/{}", prefix, q));
    store.wait(keys, timeout);
    std::string trouble;
    for (int q = 1; q < size && trouble.empty(); ++q) {
      const std::string status = store.get_string(keys[static_cast<size_t>(q - 1)]);
      if (status != "ok") trouble = fmt::format("rank {}: {}", q, status.substr(6));
    }
    comm->segment().unlink();  // every rank has it mapped: nothing is left behind from here on
    store.set(prefix + "ready", trouble.empty() ? std::string("ok") : "error " + trouble);
    LOCKSTEP_CHECK(trouble.empty(), "shm group '{}': {}", name, trouble);
  } else {
    store.wait({prefix + "segment"}, timeout);
    const std::string published = store.get_string(prefix + "segment");
    LOCKSTEP_CHECK(published.rfind("error ", 0) != 0, "{}", no_segment(name, published.substr(6)));
    const auto first = published.find(' ');
    const auto second = published.find(' ', first + 1);
    const std::string segment_name = published.substr(0, first);
    const size_t bytes = std::stoull(published.substr(first + 1, second - first - 1));
    try {
      comm = std::make_unique<Comm>(
          Segment::open(segment_name, Comm::segment_bytes(size, bytes)), rank, size, bytes,
          spin, false);
    } catch (const std::exception& e) {
      // Usually another machine's rank taken for one of this node's.
      const std::string why = fmt::format(
          "{} (rank 0 runs on host {}, this rank on {}; the ranks of a shm group must share "
          "one machine's /dev/shm: across machines use shm+gloo or gloo, and where "
          "LOCKSTEP_NODE_ID is set, give each machine its own)",
          e.what(), published.substr(second + 1), host_name());
      store.set(fmt::format("{}attached/{}", prefix, rank), "error " + why);
      throw Error(fmt::format("shm group '{}': rank {} could not join: {}", name, rank, why));
    }
    store.set(fmt::format("{}attached/{}", prefix, rank), std::string("ok"));
    store.wait({prefix + "ready"}, timeout);
    const std::string ready = store.get_string(prefix + "ready");
    LOCKSTEP_CHECK(ready == "ok", "shm group '{}': {}", name, ready.substr(6));
  }
  comm->watch_peers();
  return comm;
}

std::shared_ptr<Pool> join_pool(distributed::Store& store, const std::string& prefix, int index,
                                int rank, int size, size_t bytes,
                                std::chrono::milliseconds timeout) {
  if (bytes == 0) return nullptr;
  bytes = Pool::segment_bytes(bytes);  // else a tensor of `bytes` would not fit
  const std::string keys = fmt::format("{}pool/{}/", prefix, index);
  // Every rank publishes its segment's name (or why it has none), maps the
  // others', and says whether that worked; any failure anywhere leaves every
  // rank without the pool, all alike.
  auto gather = [&](const std::string& step, const std::string& mine) {
    store.set(fmt::format("{}{}/{}", keys, step, rank), mine);
    std::vector<std::string> names;
    for (int q = 0; q < size; ++q) names.push_back(fmt::format("{}{}/{}", keys, step, q));
    store.wait(names, timeout);
    std::vector<std::string> values;
    for (const auto& key : names) values.push_back(store.get_string(key));
    return values;
  };
  auto trouble = [](const std::vector<std::string>& values) {
    for (size_t q = 0; q < values.size(); ++q) {
      if (values[q].rfind("error ", 0) == 0) return fmt::format("rank {}: {}", q, values[q].substr(6));
    }
    return std::string();
  };
  Segment own;
  std::string made;
  try {
    own = Segment::create(new_segment_name(), bytes);
    made = own.name();
  } catch (const std::exception& e) {
    made = fmt::format("error {}", e.what());
  }
  const auto names = gather("made", made);
  std::string why = trouble(names);
  std::vector<Segment> segments(static_cast<size_t>(size));
  if (why.empty()) {
    std::string mapped = "ok";
    try {
      for (int q = 0; q < size; ++q) {
        segments[static_cast<size_t>(q)] =
            q == rank ? std::move(own) : Segment::open(names[static_cast<size_t>(q)], bytes);
      }
    } catch (const std::exception& e) {
      mapped = fmt::format("error {}", e.what());
    }
    why = trouble(gather("mapped", mapped));
  }
  if (!why.empty()) {  // the segments made are unlinked as they go
    if (rank == 0) {
      fmt::print(stderr,
                 "lockstep: warning: no shared pool of {:.1f} MiB per rank ({}); collectives stage "
                 "their data as usual\n",
                 static_cast<double>(bytes) / (1 << 20), why);
    }
    return nullptr;
  }
  segments[static_cast<size_t>(rank)].unlink();  // every rank has it mapped
  return std::make_shared<Pool>(rank, std::move(segments));
}

}  // namespace lockstep::collectives::shm
