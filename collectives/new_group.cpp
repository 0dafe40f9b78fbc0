#include "lockstep/collectives/new_group.h"

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lockstep/collectives/backend_registry.h"
#include "lockstep/collectives/debug_group.h"
#include "lockstep/collectives/forwarding_group.h"
#include "lockstep/collectives/init.h"
#include "lockstep/collectives/node_topology.h"
#include "lockstep/collectives/owned_by_process.h"
#include "lockstep/config.h"
#include "lockstep/distributed/store/prefix_store.h"

#if LOCKSTEP_HAVE_MPI
#include "lockstep/collectives/mpi/mpi_group.h"
#include "lockstep/collectives/mpi/mpi_runtime.h"
#endif

namespace lockstep::collectives {
namespace {

// The keys one new_group() call wrote on this rank: its rank lists and its
// backend's rendezvous (values), and the counters that number makings of a
// name (written by add()).
struct Written {
  std::weak_ptr<distributed::Store> store;
  std::vector<std::string> values;
  std::vector<std::string> counters;
};

// The store each group from init_process_group() or make_process_group() was
// made over, its debug level (its subgroups take it), how many new_group()
// calls it has seen (which names them), and the keys the last two wrote
// here, not yet deleted (delete_previous_keys).
struct Remembered {
  std::weak_ptr<ProcessGroup> group;
  std::weak_ptr<distributed::Store> store;
  distributed::DebugLevel debug = distributed::DebugLevel::Off;
  int new_groups = 0;
  Written last;     // the keys of the last new_group() call
  Written counted;  // the counters of the one before it
};

std::mutex remembered_mutex;
std::map<const ProcessGroup*, Remembered>& remembered() {
  static std::map<const ProcessGroup*, Remembered> groups;
  return groups;
}

// What new_group() learns of a parent it remembers: its store, its next
// new_group() number (from 1) and its debug level.
struct ParentFacts {
  std::shared_ptr<distributed::Store> store;
  int number = 0;
  distributed::DebugLevel debug = distributed::DebugLevel::Off;
};

ParentFacts next_of(const ProcessGroup& parent) {
  std::lock_guard lock(remembered_mutex);
  auto& groups = remembered();
  const auto it = groups.find(&parent);
  if (it == groups.end() || it->second.group.lock().get() != &parent) return {};
  return {it->second.store.lock(), ++it->second.new_groups, it->second.debug};
}

// A view of a store that notes the keys this rank writes through it until
// stop(): those of one new_group() call, so that the next call can delete
// them. Writes after stop() (a group's abort reason) are the group's own.
class NotingStore final : public distributed::Store {
 public:
  explicit NotingStore(std::shared_ptr<distributed::Store> inner) : inner_(std::move(inner)) {
    set_timeout(inner_->timeout());
  }

  void set(const std::string& key, const distributed::Bytes& value) override {
    note(written_.values, key);
    inner_->set(key, value);
  }
  distributed::Bytes get(const std::string& key) override {
    inner_->wait({key}, timeout());  // this view's timeout, as PrefixStore's get
    return inner_->get(key);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    note(written_.counters, key);
    return inner_->add(key, delta);
  }
  distributed::Bytes compare_set(const std::string& key, const distributed::Bytes& expected,
                                 const distributed::Bytes& desired) override {
    note(written_.values, key);
    return inner_->compare_set(key, expected, desired);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    inner_->wait(keys, timeout);
  }
  bool delete_key(const std::string& key) override { return inner_->delete_key(key); }
  int64_t num_keys() override { return inner_->num_keys(); }
  using Store::set;
  using Store::wait;

  // The keys noted so far; no more are noted after this.
  Written stop() {
    std::lock_guard lock(mutex_);
    stopped_ = true;
    written_.store = inner_;
    return std::move(written_);
  }

 private:
  void note(std::vector<std::string>& keys, const std::string& key) {
    std::lock_guard lock(mutex_);
    if (!stopped_ && std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
  }

  std::shared_ptr<distributed::Store> inner_;
  std::mutex mutex_;  // guards written_ and stopped_ (gloo writes from its own threads)
  Written written_;
  bool stopped_ = false;
};

// After call k over `parent` has agreed (every rank of `parent` has
// published its rank list, which it did once its call k-1 had returned, past
// every read of that call's keys), each rank deletes the values it wrote in
// call k-1, and the counters it wrote in call k-2 that neither call k-1 nor k
// wrote again. A counter numbers the makings of one name, and a rank
// that finds it gone starts again at 1: by then (call k+1 or later) every
// rank has deleted what it wrote in call k-1 and before, so a making of a
// name used again (NewGroupOptions::name) reads no earlier making's keys.
void delete_previous_keys(const ProcessGroup& parent, Written now) {
  Written previous, counted;
  {
    std::lock_guard lock(remembered_mutex);
    auto& groups = remembered();
    const auto it = groups.find(&parent);
    if (it == groups.end() || it->second.group.lock().get() != &parent) return;
    Remembered& r = it->second;
    counted = std::exchange(r.counted, {});
    std::erase_if(counted.counters, [&](const std::string& key) {
      return std::find(r.last.counters.begin(), r.last.counters.end(), key) !=
                 r.last.counters.end() ||
             std::find(now.counters.begin(), now.counters.end(), key) != now.counters.end();
    });
    previous = std::exchange(r.last, std::move(now));
    r.counted = {.store = previous.store, .values = {}, .counters = previous.counters};
  }
  try {
    if (const auto store = previous.store.lock())
      for (const auto& key : previous.values) store->delete_key(key);
    if (const auto store = counted.store.lock())
      for (const auto& key : counted.counters) store->delete_key(key);
  } catch (const std::exception&) {
    // The store is unreachable: the group's collectives do not need it, and
    // what could not be deleted costs the store a little memory only.
  }
}

// Whether `key` is one of the counters by which a backend numbers the groups
// made under new_group name `name`: "<name>/members/<name>/<backend>/instances/<rank>"
// (the members' prefix, then the backend's key under the group's name).
// Those of groups nested in them (a hierarchical group's) hold that number in
// their own names, so they are never used again.
bool numbers_makings_of(const std::string& key, const std::string& name) {
  const std::string prefix = name + "/members/" + name + "/";
  if (!key.starts_with(prefix)) return false;
  const std::string rest = key.substr(prefix.size());
  const size_t first = rest.find('/'), last = rest.rfind('/');
  return first != std::string::npos && rest.compare(first, last - first + 1, "/instances/") == 0;
}

// A subgroup: the member group `inner` (its own ranks 0..n-1) seen as the
// parent's ranks `ranks`. Each collective is handed to inner's front,
// checked as this group's call with the parent's rank of each of its ranks
// (ProcessGroup::check_next_as), so errors name the ranks the caller knows.
class Subgroup final : public ForwardingGroup {
 public:
  Subgroup(std::shared_ptr<ProcessGroup> inner, std::vector<int> ranks, std::string label)
      : ForwardingGroup(std::move(inner)),
        ranks_(std::make_shared<const std::vector<int>>(std::move(ranks))),
        label_(std::make_shared<const std::string>(std::move(label))) {}

 protected:
  void before_collective(const Call& call) override { next_is(call); }

 private:
  // The inner group's next collective is checked as `call`, by the parent's ranks.
  void next_is(Call call) {
    call.group = label_;
    call.signature.rank = (*ranks_)[static_cast<size_t>(rank())];
    check_next_as(inner(), call, 0, ranks_);
  }

  std::shared_ptr<const std::vector<int>> ranks_;  // the parent's rank of each of ours
  std::shared_ptr<const std::string> label_;
};

std::string list_text(const std::vector<int>& ranks) {
  return fmt::format("[{}]", fmt::join(ranks, ", "));
}

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> ranks;
  size_t start = 0;
  while (start < text.size()) {
    const size_t comma = text.find(',', start);
    const size_t end = comma == std::string::npos ? text.size() : comma;
    ranks.push_back(std::stoi(text.substr(start, end - start)));
    start = end + 1;
  }
  return ranks;
}

// Every rank's list through the store, then the same verdict on every rank:
// the lists differ, or the one list is not a set of the parent's ranks.
void agree_on_ranks(distributed::Store& store, const ProcessGroup& parent,
                    const std::vector<int>& ranks, const std::string& name,
                    std::chrono::milliseconds timeout) {
  const std::string what =
      fmt::format("new_group '{}' over group '{}' ({} ranks)", name, parent.name(), parent.size());
  std::vector<std::string> lists;
  try {
    lists = exchange_through_store(store, parent.rank(), parent.size(), name, "new_group-ranks",
                                   fmt::format("{}", fmt::join(ranks, ",")), "rank list",
                                   timeout);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}. Every rank of group '{}' must call new_group, members or "
                            "not, in the same order of new_group calls",
                            what, e.what(), parent.name()));
  }
  if (std::adjacent_find(lists.begin(), lists.end(), std::not_equal_to<>()) != lists.end()) {
    std::vector<std::pair<std::string, std::vector<int>>> passed;  // list, ranks passing it
    for (size_t r = 0; r < lists.size(); ++r) {
      auto it = std::find_if(passed.begin(), passed.end(),
                             [&](const auto& p) { return p.first == lists[r]; });
      if (it == passed.end()) it = passed.insert(passed.end(), {lists[r], {}});
      it->second.push_back(static_cast<int>(r));
    }
    std::vector<std::string> parts;
    for (const auto& [list, who] : passed)
      parts.push_back(fmt::format("{} passed {}", ranks_text(who), list_text(parse_list(list))));
    throw Error(fmt::format(
        "{}: the ranks passed different rank lists: {}. Every rank of group '{}' must call "
        "new_group with the same ranks, members or not, in the same order of new_group calls",
        what, fmt::join(parts, "; "), parent.name()));
  }
  const std::string every = fmt::format("every rank passed {}", list_text(ranks));
  LOCKSTEP_CHECK(!ranks.empty(),
                 "{}: {}, an empty list; pass the ranks (0 to {}) the group holds, all of them "
                 "for a group over every rank (PyTorch's new_group() with no ranks)",
                 what, every, parent.size() - 1);
  for (int r : ranks) {
    LOCKSTEP_CHECK(r >= 0 && r < parent.size(),
                   "{}: {}, which holds {}, not a rank of group '{}' (its ranks are 0 to {})",
                   what, every, r, parent.name(), parent.size() - 1);
    LOCKSTEP_CHECK(std::count(ranks.begin(), ranks.end(), r) == 1,
                   "{}: {}, which names rank {} more than once; name each rank once", what,
                   every, r);
  }
}

// new_group()'s group over mpi, on every rank of `parent` (nullptr on
// non-members): a split of MPI_COMM_WORLD, which needs `parent` to be the
// whole MPI job (make_mpi_subgroup()).
std::shared_ptr<ProcessGroup> mpi_subgroup(const ProcessGroup& parent,
                                           const std::vector<int>& ranks,
                                           const std::string& name,
                                           std::chrono::milliseconds timeout) {
#if LOCKSTEP_HAVE_MPI
  mpi::ensure_mpi_initialized();
  LOCKSTEP_CHECK(parent.size() == mpi::world_size() && parent.rank() == mpi::world_rank(),
                 "new_group '{}' over mpi: group '{}' (rank {} of {}) is not the whole MPI job "
                 "(MPI_COMM_WORLD rank {} of {}), and an mpi group over some ranks is made "
                 "from it; make it over the job's group, or pass NewGroupOptions::backend "
                 "(gloo or shm)",
                 name, parent.name(), parent.rank(), parent.size(), mpi::world_rank(),
                 mpi::world_size());
  return make_mpi_subgroup(ranks, name, timeout);
#else
  (void)parent, (void)ranks, (void)name, (void)timeout;
  return nullptr;  // not reached: require_backend("mpi") refused it
#endif
}

}  // namespace

void remember_group_store(const std::shared_ptr<ProcessGroup>& group,
                          std::shared_ptr<distributed::Store> store,
                          distributed::DebugLevel debug) {
  if (group == nullptr || store == nullptr) return;
  std::lock_guard lock(remembered_mutex);
  auto& groups = remembered();
  std::erase_if(groups, [](const auto& entry) { return entry.second.group.expired(); });
  groups[group.get()] = {.group = group, .store = std::move(store), .debug = debug};
}

std::shared_ptr<ProcessGroup> new_group(ProcessGroup& parent, std::vector<int> ranks,
                                        const NewGroupOptions& options) {
  auto [store, number, debug] = next_of(parent);
  if (options.store != nullptr) store = options.store;
  LOCKSTEP_CHECK(store != nullptr,
                 "new_group over group '{}': no store is known for it (it was not made by "
                 "init_process_group() or make_process_group()); pass NewGroupOptions::store, "
                 "the store its ranks met on",
                 parent.name());
  LOCKSTEP_CHECK(!options.name.empty() || number > 0,
                 "new_group over group '{}': it was not made by init_process_group() or "
                 "make_process_group(), so pass NewGroupOptions::name (the same on every rank)",
                 parent.name());
  const std::string name = !options.name.empty()
                               ? options.name
                               : fmt::format("{}/new_group{}", parent.name(), number);
  const std::chrono::milliseconds timeout = options.timeout.value_or(parent.timeout());
  const auto noting = std::make_shared<NotingStore>(store);
  agree_on_ranks(*noting, parent, ranks, name, timeout);
  const auto done = [&] {
    Written written = noting->stop();
    // The counters that number the makings of a name given again stay: a
    // group of that name may still live, and one made after they were
    // deleted would take its keys' prefix. A generated name is never reused.
    if (!options.name.empty()) std::erase_if(written.counters, [&](const std::string& key) {
      return numbers_makings_of(key, name);
    });
    delete_previous_keys(parent, std::move(written));
  };

  std::sort(ranks.begin(), ranks.end());
  const std::string backend = !options.backend.empty() ? options.backend : parent.backend();
  require_backend(backend);
  // mpi splits the job's communicator, with every process of it.
  std::shared_ptr<ProcessGroup> inner =
      backend == "mpi" ? mpi_subgroup(parent, ranks, name, timeout) : nullptr;
  const auto mine = std::find(ranks.begin(), ranks.end(), parent.rank());
  if (mine == ranks.end()) {
    done();
    return nullptr;
  }
  auto group_store =
      std::make_shared<distributed::PrefixStore>(fmt::format("{}/members", name), noting);
  // The backend's own group, which checks each call: the Subgroup maps its
  // calls onto it (check_next_as), and device staging, where the build has
  // it, goes around the Subgroup. Inside it, the staging group's own calls
  // would be the ones mapped, and the backend's would name the subgroup's
  // ranks.
  if (inner == nullptr)
    inner = make_backend_group(backend, {.store = group_store,
                                         .rank = static_cast<int>(mine - ranks.begin()),
                                         .size = static_cast<int>(ranks.size()),
                                         .name = name,
                                         .timeout = timeout});
  inner->report_stalls_after(parent.stall_report_after());
  std::string label = fmt::format("group '{}' ({}, {} ranks: {} of group '{}')", name,
                                  inner->backend(), ranks.size(), ranks_text(ranks),
                                  parent.name());
  std::shared_ptr<ProcessGroup> group = with_device_staging(
      std::make_shared<Subgroup>(std::move(inner), std::move(ranks), label), backend);
  // LOCKSTEP_DEBUG=detail checks a subgroup's calls as its parent's, as
  // TORCH_DISTRIBUTED_DEBUG does every group's. Its keys are the group's own
  // (under its name, on the unnoted store), deleted by the group itself.
  if (debug == distributed::DebugLevel::Detail)
    group = make_debug_group(std::move(group), store, std::move(label));
  ProcessGroup* raw = group.get();
  std::shared_ptr<ProcessGroup> owned = owned_by_this_process(std::move(group), raw);
  remember_group_store(owned, group_store, debug);
  done();
  return owned;
}

}  // namespace lockstep::collectives
