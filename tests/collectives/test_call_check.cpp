// Every backend checks, always, that all ranks issue the same collective: a
// mismatch fails every rank at once, naming the call number and what each
// rank called, and leaves the group unusable. And a rank that never joins is
// named, with the last collective it completed, when the others time out.
// In one process, one thread per rank, for shm, gloo and the hierarchical
// group (gloo and shm within its nodes).
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <latch>

#include "collectives/rank_threads.h"
#include "lockstep/collectives/hierarchical_group.h"
#include "lockstep/collectives/node_topology.h"
#include "lockstep/config.h"
#include "lockstep/distributed/store/memory_store.h"
#include "support/test_util.h"

namespace lc = lockstep::collectives;
namespace lt = lockstep::testing;
using Catch::Matchers::Contains;
using lockstep::runtime::DType;
using lockstep::runtime::Tensor;
using namespace std::chrono_literals;

namespace {

using Groups = std::vector<std::shared_ptr<lc::ProcessGroup>>;

// "shm", "gloo", or "shm+gloo"/"gloo+gloo" on two nodes {0}, {1, ...}.
Groups make(const std::string& backend, int size, const std::string& name,
            std::chrono::milliseconds timeout = 30s) {
  if (backend.find('+') == std::string::npos) return lt::make_groups(backend, size, name, timeout);
  const std::string intra = backend.substr(0, backend.find('+'));
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  Groups groups(static_cast<size_t>(size));
  const auto errors = lt::run_ranks(size, [&](int r) {
    const auto topology =
        lc::discover_topology(*store, r, size, name, r == 0 ? "node-a" : "node-b", timeout);
    groups[static_cast<size_t>(r)] =
        lc::make_hierarchical_group(store, r, size, name, timeout, topology, intra);
  });
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return groups;
}

std::vector<std::string> backends() {
  std::vector<std::string> names = {"shm"};
  if (LOCKSTEP_HAVE_GLOO) {
    names.push_back("gloo");
    names.push_back("shm+gloo");
    names.push_back("gloo+gloo");
  }
  return names;
}

// What each rank's call threw: "<no exception>", or "<type>: <message>".
struct Outcome {
  std::string first;   // the mismatched call
  std::string second;  // a call after it
};

std::string outcome_of(const std::function<void()>& fn) {
  try {
    fn();
    return "<no exception>";
  } catch (const lc::CollectiveMismatch& e) {
    return std::string("CollectiveMismatch: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("other: ") + e.what();
  }
}

bool flat(const std::string& backend) { return backend.find('+') == std::string::npos; }

// A hierarchical group checks each rank against its node's leader and the
// leaders against each other. The ranks of the level where the calls differ
// get CollectiveMismatch naming this group's call and their calls; the
// others fail when the group is aborted under them, with that message as the
// reason (a rank whose own part completed, as a broadcast's root, fails at
// its next call).
void check_hierarchical(const std::vector<Outcome>& outcomes, const std::string& group,
                        const std::vector<std::string>& calls) {
  const std::string differs =
      fmt::format("collective #3 differs across the ranks of group '{}'", group);
  std::string all;
  int mismatches = 0;
  for (const auto& o : outcomes) {
    CHECK_THAT(o.first + o.second, Contains(differs));
    CHECK_THAT(o.second, Contains("unusable"));
    if (o.first.rfind("CollectiveMismatch", 0) == 0) ++mismatches;
    all += o.first + "\n";
  }
  CHECK(mismatches >= 2);
  for (const auto& call : calls) CHECK_THAT(all, Contains(call));
}

// Each rank runs two matched allreduces, then `mismatched(rank)`, then one
// more allreduce.
std::vector<Outcome> run_mismatch(const Groups& groups,
                                  const std::function<void(lc::ProcessGroup&)>& mismatched) {
  const int size = static_cast<int>(groups.size());
  std::vector<Outcome> outcomes(static_cast<size_t>(size));
  const auto errors = lt::run_ranks(size, [&](int r) {
    auto& g = *groups[static_cast<size_t>(r)];
    Tensor warm = Tensor::ones({3});
    g.allreduce(warm)->wait();
    g.allreduce(warm)->wait();
    auto& o = outcomes[static_cast<size_t>(r)];
    o.first = outcome_of([&] { mismatched(g); });
    Tensor after = Tensor::ones({3});
    o.second = outcome_of([&] { g.allreduce(after)->wait(); });
  });
  for (const auto& e : errors) CHECK(lt::message_of(e) == "<no exception>");
  return outcomes;
}

}  // namespace

TEST_CASE("call check: allreduce(i64, 2) against allreduce(f32, 1059850) fails every rank",
          "[collectives][call_check]") {
  const std::string backend = GENERATE(from_range(backends()));
  INFO("backend " << backend);
  const auto groups = make(backend, 2, "mismatch-" + backend);
  const auto outcomes = run_mismatch(groups, [](lc::ProcessGroup& g) {
    // The classic: rank 0 has run out of batches and evaluates, rank 1 still
    // all-reduces its gradient bucket.
    Tensor t = g.rank() == 0 ? Tensor::zeros({2}, DType::i64) : Tensor::zeros({1059850});
    g.allreduce(t)->wait();
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    const auto& o = outcomes[static_cast<size_t>(r)];
    CHECK_THAT(o.first, Contains("CollectiveMismatch: collective #3 differs") &&
                            Contains("rank 0 called allreduce(i64, 2 elements, sum)") &&
                            Contains("rank 1 called allreduce(f32, 1059850 elements, sum)"));
    // The group says why it is unusable.
    CHECK_THAT(o.second, Contains("unusable") && Contains("collective #3 differs"));
  }
}

TEST_CASE("call check: different ops, roots and an empty call are told apart",
          "[collectives][call_check]") {
  const std::string backend = GENERATE(from_range(backends()));
  INFO("backend " << backend);
  SECTION("allreduce, broadcast and barrier on three ranks") {
    const auto groups = make(backend, 3, "kinds-" + backend);
    const auto outcomes = run_mismatch(groups, [](lc::ProcessGroup& g) {
      Tensor t = Tensor::zeros({1000});
      if (g.rank() == 0) g.allreduce(t)->wait();
      if (g.rank() == 1) g.barrier()->wait();
      if (g.rank() == 2) g.broadcast(t, {.root = 2, .timeout = {}})->wait();
    });
    if (flat(backend)) {
      for (const auto& o : outcomes) {
        CHECK_THAT(o.first, Contains("CollectiveMismatch: collective #3") &&
                                Contains("rank 0 called allreduce(f32, 1000 elements, sum)") &&
                                Contains("rank 1 called barrier()") &&
                                Contains("rank 2 called broadcast(f32, 1000 elements, root 2)"));
      }
    } else {
      check_hierarchical(
          outcomes, "kinds-" + backend,
          {"rank 1 called barrier()", "rank 2 called broadcast(f32, 1000 elements, root 2)"});
    }
  }
  SECTION("broadcast from different roots") {
    const auto groups = make(backend, 3, "roots-" + backend);
    const auto outcomes = run_mismatch(groups, [](lc::ProcessGroup& g) {
      Tensor t = Tensor::zeros({10});
      g.broadcast(t, {.root = g.rank() == 2 ? 1 : 0, .timeout = {}})->wait();
    });
    if (flat(backend)) {
      for (const auto& o : outcomes) {
        CHECK_THAT(o.first,
                   Contains("CollectiveMismatch") &&
                       Contains("ranks 0 and 1 called broadcast(f32, 10 elements, root 0)") &&
                       Contains("rank 2 called broadcast(f32, 10 elements, root 1)"));
      }
    } else {
      check_hierarchical(outcomes, "roots-" + backend,
                         {"called broadcast(f32, 10 elements, root 0)",
                          "rank 2 called broadcast(f32, 10 elements, root 1)"});
    }
  }
  SECTION("an allreduce of nothing against one of something") {
    const auto groups = make(backend, 2, "empty-" + backend);
    const auto outcomes = run_mismatch(groups, [](lc::ProcessGroup& g) {
      Tensor t = Tensor::zeros({g.rank() == 0 ? 0 : 4});
      g.allreduce(t, {.op = lc::ReduceOp::Max, .timeout = {}})->wait();
    });
    for (const auto& o : outcomes) {
      CHECK_THAT(o.first, Contains("CollectiveMismatch") &&
                              Contains("rank 0 called allreduce(f32, 0 elements, max)") &&
                              Contains("rank 1 called allreduce(f32, 4 elements, max)"));
    }
  }
}

TEST_CASE("call check: matched calls of every kind still pass, empty ones included",
          "[collectives][call_check]") {
  const std::string backend = GENERATE(from_range(backends()));
  INFO("backend " << backend);
  const int size = 3;
  const auto groups = make(backend, size, "matched-" + backend);
  std::vector<double> sums(size);
  const auto errors = lt::run_ranks(size, [&](int r) {
    auto& g = *groups[static_cast<size_t>(r)];
    Tensor empty = Tensor::zeros({0});
    for (int k = 0; k < 3; ++k) g.allreduce(empty)->wait();
    g.barrier()->wait();
    Tensor t = Tensor::full({5}, r + 1);
    g.allreduce(t)->wait();
    g.broadcast(empty, {.root = 1, .timeout = {}})->wait();
    Tensor out = Tensor::zeros({5 * size});
    g.allgather(out, t)->wait();
    sums[static_cast<size_t>(r)] = lt::values(out)[0] + lt::values(t)[4];
  });
  for (const auto& e : errors) CHECK(lt::message_of(e) == "<no exception>");
  for (double s : sums) CHECK(s == 12.0);  // 1 + 2 + 3, gathered and reduced
}

TEST_CASE("a rank that never joins is named, with the last collective it completed",
          "[collectives][call_check]") {
  const std::string backend = GENERATE(from_range(backends()));
  INFO("backend " << backend);
  const int size = 3, absent = 2;
  const auto groups = make(backend, size, "absent-" + backend, 2s);
  std::latch others_done(size - 1);
  std::vector<std::string> messages(size);
  const auto errors = lt::run_ranks(size, [&](int r) {
    auto& g = *groups[static_cast<size_t>(r)];
    Tensor t = Tensor::ones({16});
    g.allreduce(t, {.op = lc::ReduceOp::Max, .timeout = {}})->wait();
    if (r == absent) {
      others_done.wait();
      return;
    }
    messages[static_cast<size_t>(r)] = lt::error_of([&] { g.barrier()->wait(); });
    others_done.count_down();
  });
  for (const auto& e : errors) CHECK(lt::message_of(e) == "<no exception>");
  for (int r = 0; r < size; ++r) {
    if (r == absent) continue;
    INFO("rank " << r);
    const auto& m = messages[static_cast<size_t>(r)];
    CHECK_THAT(m, Contains("timed out"));
    if (backend == "shm" || backend == "gloo") {
      // Flat groups name the rank and where it stopped.
      CHECK_THAT(m, Contains("barrier #2") && Contains("rank 2") && Contains("did not join it") &&
                        Contains("#1 allreduce(f32, 16 elements, max)"));
    }
  }
}
