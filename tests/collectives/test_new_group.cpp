// new_group(): groups over some of a group's ranks, on every CPU backend
// whose ranks can be threads (shm, and gloo where built in).
#include <catch2/catch.hpp>

#include <mutex>
#include <set>

#include "collectives/rank_threads.h"
#include "lockstep/collectives/new_group.h"
#include "lockstep/runtime/ops.h"
#include "support/backend_skip.h"
#include "support/test_util.h"

namespace lt = lockstep::testing;
using lockstep::collectives::new_group;
using lockstep::collectives::ProcessGroup;
using lockstep::runtime::DType;
using lockstep::runtime::Tensor;

namespace {

// Runs fn(rank, parent) on 4 rank threads over `backend`; each rank's error
// message, "" where none.
std::vector<std::string> on_four_ranks(const std::string& backend,
                                       const std::function<void(int, ProcessGroup&)>& fn) {
  const auto parents = lt::make_groups(backend, 4, "default");
  const auto errors = lt::run_ranks(4, [&](int r) { fn(r, *parents[static_cast<size_t>(r)]); });
  std::vector<std::string> messages;
  for (const auto& e : errors) messages.push_back(e ? lt::message_of(e) : "");
  return messages;
}

std::string joined(const std::vector<std::string>& messages) {
  std::string out;
  for (size_t r = 0; r < messages.size(); ++r)
    if (!messages[r].empty()) out += fmt::format("rank {}: {}\n", r, messages[r]);
  return out;
}

// A MemoryStore that lists its keys, so that a test of what a store keeps
// names the keys left over, not only their count.
class ListingStore final : public lockstep::distributed::Store {
 public:
  void set(const std::string& key, const lockstep::distributed::Bytes& value) override {
    inner_.set(key, value);
    note(key);
  }
  lockstep::distributed::Bytes get(const std::string& key) override { return inner_.get(key); }
  int64_t add(const std::string& key, int64_t delta) override {
    const int64_t result = inner_.add(key, delta);
    note(key);
    return result;
  }
  lockstep::distributed::Bytes compare_set(const std::string& key,
                                           const lockstep::distributed::Bytes& expected,
                                           const lockstep::distributed::Bytes& desired) override {
    auto result = inner_.compare_set(key, expected, desired);
    note(key);
    return result;
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    inner_.wait(keys, timeout);
  }
  bool delete_key(const std::string& key) override {
    std::lock_guard lock(mutex_);
    keys_.erase(key);
    return inner_.delete_key(key);
  }
  int64_t num_keys() override { return inner_.num_keys(); }
  using Store::set;
  using Store::wait;

  std::string keys() {
    std::lock_guard lock(mutex_);
    std::string out;
    for (const auto& key : keys_) out += key + "\n";
    return out;
  }

 private:
  void note(const std::string& key) {
    std::lock_guard lock(mutex_);
    keys_.insert(key);
  }
  lockstep::distributed::MemoryStore inner_;
  std::mutex mutex_;
  std::set<std::string> keys_;
};

}  // namespace

TEST_CASE("new_group gives members a group of their own ranks and non-members nullptr",
          "[collectives][new_group]") {
  for (const std::string& backend : lt::cpu_backends()) {
    INFO(backend);
    std::vector<std::string> problems(4);
    const auto errors = on_four_ranks(backend, [&](int r, ProcessGroup& parent) {
      // Two disjoint groups, then one over ranks given out of order.
      auto low = new_group(parent, {0, 1});
      auto high = new_group(parent, {2, 3});
      auto odd = new_group(parent, {3, 1});
      std::string& problem = problems[static_cast<size_t>(r)];
      if ((low != nullptr) != (r < 2) || (high != nullptr) != (r >= 2) ||
          (odd != nullptr) != (r % 2 == 1)) {
        problem = "membership is wrong";
        return;
      }
      ProcessGroup& pair = low ? *low : *high;
      if (pair.size() != 2 || pair.rank() != r % 2 || pair.backend() != parent.backend()) {
        problem = fmt::format("pair group: rank {} size {} backend {}", pair.rank(), pair.size(),
                              pair.backend());
        return;
      }
      // Each pair sums over its own ranks only: 1 + 2 and 3 + 4.
      Tensor t = Tensor::full({3}, static_cast<double>(r + 1), DType::f32);
      pair.allreduce(t)->wait();
      const float want = r < 2 ? 3.0f : 7.0f;
      if (t.to_vector<float>() != std::vector<float>(3, want))
        problem = fmt::format("pair allreduce gave {}", t.to_vector<float>()[0]);
      if (odd) {
        // Sorted: rank 1 is the odd group's rank 0, and its root.
        Tensor b = Tensor::full({2}, static_cast<double>(r * 10), DType::f32);
        odd->broadcast(b, {.root = 0})->wait();
        if (odd->rank() != r / 2 || b.to_vector<float>() != std::vector<float>(2, 10.0f))
          problem += fmt::format(" odd group: rank {}, broadcast gave {}", odd->rank(),
                                 b.to_vector<float>()[0]);
      }
      parent.barrier()->wait();
    });
    CHECK(joined(errors).empty());
    CHECK(joined(problems).empty());
  }
}

TEST_CASE("new_group with rank lists that differ across ranks fails on every rank",
          "[collectives][new_group]") {
  const auto errors = on_four_ranks(lt::kThreadRankBackend, [](int r, ProcessGroup& parent) {
    new_group(parent, r == 2 ? std::vector<int>{0, 2} : std::vector<int>{0, 1});
  });
  for (const std::string& message : errors) {
    INFO(message);
    CHECK_THAT(message, Catch::Contains("different rank lists") &&
                            Catch::Contains("ranks 0, 1 and 3 passed [0, 1]; rank 2 passed "
                                            "[0, 2]"));
  }
}

TEST_CASE("new_group refuses an empty list, a duplicate and a rank outside the group",
          "[collectives][new_group]") {
  const std::vector<std::pair<std::vector<int>, std::string>> cases = {
      {{}, "an empty list"},
      {{0, 1, 1}, "names rank 1 more than once"},
      {{0, 4}, "holds 4, not a rank of group 'default' (its ranks are 0 to 3)"},
      {{-1, 2}, "holds -1, not a rank"}};
  for (const auto& [ranks, expected] : cases) {
    const auto errors = on_four_ranks(lt::kThreadRankBackend,
                                      [&](int, ProcessGroup& parent) { new_group(parent, ranks); });
    for (const std::string& message : errors) {
      INFO(message);
      CHECK_THAT(message, Catch::Contains("new_group 'default/new_group1'") &&
                              Catch::Contains(expected));
    }
  }
}

TEST_CASE("a subgroup's collective mismatch names the parent's ranks", "[collectives][new_group]") {
  for (const std::string& backend : lt::cpu_backends()) {
    INFO(backend);
    const auto errors = on_four_ranks(backend, [](int r, ProcessGroup& parent) {
      auto odd = new_group(parent, {1, 3});
      if (!odd) return;
      // Ranks 1 and 3 (the group's 0 and 1) all-reduce different counts.
      Tensor t = Tensor::zeros({r == 1 ? 4 : 8}, DType::f32);
      odd->allreduce(t)->wait();
    });
    CHECK(errors[0].empty());
    CHECK(errors[2].empty());
    for (int r : {1, 3}) {
      const std::string& message = errors[static_cast<size_t>(r)];
      INFO(message);
      CHECK_THAT(message, Catch::Contains("ranks 1 and 3 of group 'default'"));
      CHECK_THAT(message, Catch::Contains("rank 1 called allreduce(f32, 4 elements") ||
                              Catch::Contains("rank 1 of group 'default/new_group1'"));
      CHECK_THAT(message, !Catch::Contains("rank 0 called"));
    }
  }
}

TEST_CASE("new_group over init_process_group's group, and over a group from new_group",
          "[collectives][new_group]") {
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  std::vector<std::string> problems(4);
  const auto raised = lt::run_ranks(4, [&](int r) {
    lockstep::distributed::RankInfo info;
    info.rank = info.local_rank = r;
    info.world_size = info.local_world_size = 4;
    info.backend = lt::kThreadRankBackend;
    auto world = lockstep::collectives::init_process_group(
        {.timeout = std::chrono::seconds(60), .rank_info = info, .store = store});
    auto odd = new_group(*world, {1, 3});
    // Within {1, 3}: its rank 1 (the job's rank 3) alone.
    auto last = odd ? new_group(*odd, {1}) : nullptr;
    std::string& problem = problems[static_cast<size_t>(r)];
    if ((last != nullptr) != (r == 3)) problem = "membership of the nested group is wrong";
    if (last) {
      Tensor t = Tensor::full({2}, 5.0, DType::f32);
      last->allreduce(t)->wait();
      if (last->size() != 1 || last->rank() != 0 ||
          last->name() != "default/new_group1/new_group1" ||
          t.to_vector<float>() != std::vector<float>(2, 5.0f))
        problem = fmt::format("nested group: {} rank {} of {}", last->name(), last->rank(),
                              last->size());
    }
  });
  for (const auto& e : raised) CHECK(lt::message_of(e) == "<no exception>");
  CHECK(joined(problems).empty());
}

TEST_CASE("new_group names the ranks that never called it", "[collectives][new_group]") {
  // Rank 3 never calls new_group: the others fail once the call's timeout
  // (short here) is out, naming it.
  const auto errors = on_four_ranks(lt::kThreadRankBackend, [](int r, ProcessGroup& parent) {
    if (r != 3) new_group(parent, {0, 1}, {.timeout = std::chrono::milliseconds(300)});
  });
  CHECK(errors[3].empty());
  for (int r : {0, 1, 2}) {
    INFO(errors[static_cast<size_t>(r)]);
    CHECK_THAT(errors[static_cast<size_t>(r)],
               Catch::Contains("rank list") && Catch::Contains("rank 3"));
  }
}

TEST_CASE("the stall report interval holds through wrapper groups and into new_group",
          "[collectives][new_group]") {
  // LOCKSTEP_DEBUG=detail (and CUDA staging, in a build with CUDA) wraps the
  // backend's group: the interval is the backend's, which does the waiting.
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  std::vector<std::string> problems(2);
  const auto raised = lt::run_ranks(2, [&](int r) {
    lockstep::distributed::RankInfo info;
    info.rank = info.local_rank = r;
    info.world_size = info.local_world_size = 2;
    info.backend = lt::kThreadRankBackend;
    info.debug = lockstep::distributed::DebugLevel::Detail;
    info.stall_report = std::chrono::seconds(7);
    auto world = lockstep::collectives::init_process_group(
        {.timeout = std::chrono::seconds(60), .rank_info = info, .store = store});
    std::string& problem = problems[static_cast<size_t>(r)];
    auto both = new_group(*world, {0, 1});
    if (world->stall_report_after() != std::chrono::seconds(7) ||
        both->stall_report_after() != std::chrono::seconds(7))
      problem = fmt::format("intervals {} and {} ms, not 7 s", world->stall_report_after().count(),
                            both->stall_report_after().count());
    world->report_stalls_after(std::chrono::seconds(3));
    auto later = new_group(*world, {0, 1});
    if (later->stall_report_after() != std::chrono::seconds(3))
      problem += fmt::format(" set on the group, a later new_group has {} ms",
                             later->stall_report_after().count());
  });
  for (const auto& e : raised) CHECK(lt::message_of(e) == "<no exception>");
  CHECK(joined(problems).empty());
}

TEST_CASE("new_group in a loop leaves the store no more keys than its first calls did",
          "[collectives][new_group]") {
  // A job that makes a subgroup per evaluation: each new_group's rank lists
  // and rendezvous keys go once the next new_group has begun, so the store
  // (a TCP store server for days) stops growing. Rank 3 is a member of no
  // group; the named groups reuse one name.
  std::vector<std::string> backends = lt::cpu_backends();
  if (LOCKSTEP_HAVE_GLOO) backends.push_back("shm+gloo");
  for (const std::string& backend : backends) {
    INFO(backend);
    auto store = std::make_shared<ListingStore>();
    std::vector<std::shared_ptr<ProcessGroup>> parents(4);
    const auto made = lt::run_ranks(4, [&](int r) {
      parents[static_cast<size_t>(r)] = lockstep::collectives::make_process_group(
          backend, store, r, 4, "default", std::chrono::seconds(60));
    });
    for (const auto& e : made) REQUIRE(lt::message_of(e) == "<no exception>");
    const auto rounds = [&](int n) {
      const auto errors = lt::run_ranks(4, [&](int r) {
        ProcessGroup& parent = *parents[static_cast<size_t>(r)];
        for (int i = 0; i < n; ++i) {
          auto pair = new_group(parent, {i % 2, 2});
          auto named = new_group(parent, {0, 1, 2}, {.name = "eval"});
          Tensor t = Tensor::full({2}, 1.0, DType::f32);
          if (pair) pair->allreduce(t)->wait();
          if (named) named->allreduce(t)->wait();
        }
      });
      for (const auto& e : errors) REQUIRE(lt::message_of(e) == "<no exception>");
      return store->num_keys();
    };
    const int64_t after_two = rounds(2);
    const std::string keys_after_two = store->keys();
    const int64_t after_many = rounds(20);
    INFO("after 2 rounds:\n" << keys_after_two << "after 22 rounds:\n" << store->keys());
    CHECK(after_many == after_two);
  }
}

TEST_CASE("a new_group name given again while its first group lives makes a group of its own",
          "[collectives][new_group]") {
  // The store's keys of earlier new_group calls are deleted (the test above),
  // but not the counters that number a given name's makings: the second
  // "kept" group must not take the keys of the first, which is still alive,
  // nor hear of its end.
  std::vector<std::string> backends = lt::cpu_backends();
  if (LOCKSTEP_HAVE_GLOO) backends.push_back("shm+gloo");
  for (const std::string& backend : backends) {
    INFO(backend);
    auto store = std::make_shared<lockstep::distributed::MemoryStore>();
    std::vector<std::string> problems(4);
    const auto errors = lt::run_ranks(4, [&](int r) {
      auto parent = lockstep::collectives::make_process_group(backend, store, r, 4, "default",
                                                              std::chrono::seconds(60));
      auto first = new_group(*parent, {0, 1, 2}, {.name = "kept"});
      for (int i = 0; i < 3; ++i) new_group(*parent, {i % 2, 3});
      auto second = new_group(*parent, {0, 1, 2}, {.name = "kept"});
      if (first) first->reserve_shared_pool(4096);
      if (second) second->reserve_shared_pool(4096);
      parent->barrier()->wait();
      first.reset();  // the first group ends on every rank
      parent->barrier()->wait();
      if (second) {
        Tensor t = Tensor::full({3}, static_cast<double>(r + 1), DType::f32);
        second->allreduce(t)->wait();
        if (t.to_vector<float>() != std::vector<float>(3, 6.0f))
          problems[static_cast<size_t>(r)] = fmt::format("sum {}", t.to_vector<float>()[0]);
      }
      parent->barrier()->wait();
    });
    for (size_t r = 0; r < 4; ++r) problems[r] += errors[r] ? lt::message_of(errors[r]) : "";
    CHECK(joined(problems).empty());
    // The backend numbered the two makings 1 and 2: the second's keys are its own.
    const std::string kind = backend == "shm+gloo" ? "hierarchical" : backend;
    for (int r = 0; r < 3; ++r)
      CHECK(store->add(fmt::format("kept/members/kept/{}/instances/{}", kind, r), 0) == 2);
  }
}

TEST_CASE("a subgroup of a group under LOCKSTEP_DEBUG=detail has its calls checked too",
          "[collectives][new_group]") {
  // The detail check names a rank that never arrives with its last call; the
  // always-on check alone could only wait out the timeout. A subgroup made
  // over a subgroup takes the level as well.
  using namespace std::chrono_literals;
  const bool nested = GENERATE(false, true);
  INFO("a subgroup of a subgroup: " << nested);
  const auto parents = lt::make_groups(lt::kThreadRankBackend, 4, "default", 1500ms,
                                       lockstep::distributed::DebugLevel::Detail);
  std::string seen;
  std::vector<std::shared_ptr<ProcessGroup>> kept(4);  // rank 3's outlives its thread
  const auto errors = lt::run_ranks(4, [&](int r) {
    std::shared_ptr<ProcessGroup> odd = new_group(*parents[static_cast<size_t>(r)], {1, 3});
    if (odd && nested) odd = new_group(*odd, {0, 1});
    kept[static_cast<size_t>(r)] = odd;
    if (!odd) return;
    odd->barrier()->wait();
    if (r == 3) return;  // stops issuing collectives
    Tensor t = Tensor::zeros({4});
    seen = lt::error_of([&] { odd->allreduce(t)->wait(); });
  });
  for (const auto& e : errors) CHECK(lt::message_of(e) == "<no exception>");
  CHECK_THAT(seen, Catch::Contains("collective #2 (allreduce(f32, 4 elements, sum)) on rank 0") &&
                       Catch::Contains("rank 1 did not issue collective #2") &&
                       Catch::Contains("rank 1's last recorded call was collective #1: barrier()"));
  // Its ranks are named as the parent's.
  CHECK_THAT(seen, Catch::Contains(nested ? "2 ranks: ranks 0 and 1 of group 'default/new_group1')"
                                          : "2 ranks: ranks 1 and 3 of group 'default')"));
}
