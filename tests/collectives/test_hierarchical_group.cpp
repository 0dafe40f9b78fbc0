// The hierarchical group in one process: one thread per rank over a
// MemoryStore, with node keys given explicitly so that threads of one process
// act as ranks of several nodes. The intra-node backend is gloo here, which
// exercises the same three steps as shm; the tests at the end use shm itself.
//
// Inputs and exact expected values come from collective_check.h.
#include <catch2/catch.hpp>

#include "lockstep/config.h"

#if LOCKSTEP_HAVE_GLOO

#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <latch>
#include <thread>

#include <fmt/ranges.h>

#include "collectives/collective_check.h"
#include "collectives/rank_threads.h"
#include "lockstep/collectives/hierarchical_group.h"
#include "lockstep/collectives/node_topology.h"
#include "lockstep/collectives/spawn.h"
#include "support/test_util.h"

namespace lc = lockstep::collectives;
namespace lt = lockstep::testing;
using lockstep::runtime::DType;
using lockstep::runtime::Tensor;
using lt::add_failure;
using lt::expected_value;
using lt::input;
using lt::input_value;
using lt::mismatch;
using lt::on_every_rank;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

namespace {

using Keys = std::vector<std::string>;

// One hierarchical group per rank; rank r's node is keys[r]. The topology is
// discovered through the store, as init_process_group() does.
std::vector<std::shared_ptr<lc::ProcessGroup>> make_groups(
    const Keys& keys, const std::string& name, std::chrono::milliseconds timeout = 60s) {
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  const int size = static_cast<int>(keys.size());
  std::vector<std::shared_ptr<lc::ProcessGroup>> groups(static_cast<size_t>(size));
  const auto errors = lt::run_ranks(size, [&](int r) {
    const auto topology =
        lc::discover_topology(*store, r, size, name, keys[static_cast<size_t>(r)], timeout);
    groups[static_cast<size_t>(r)] =
        lc::make_hierarchical_group(store, r, size, name, timeout, topology, "gloo");
  });
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return groups;
}

// `t`'s values in a tensor taken from `pool`, which the group reads in place.
Tensor copied_into(lc::SharedTensorPool& pool, const Tensor& t) {
  Tensor in_pool = pool.empty(t.shape(), t.dtype());
  in_pool.copy_(t);
  return in_pool;
}

// The layouts every test runs on: two even nodes, uneven nodes, nodes whose
// ranks interleave, and every node a single rank.
const std::vector<Keys> kLayouts = {
    {"a", "a", "b", "b"}, {"a", "b", "b", "b"}, {"a", "b", "a", "b"}, {"a", "b", "c"}};

std::string layout_name(const Keys& keys) { return fmt::format("{{{}}}", fmt::join(keys, ",")); }

}  // namespace

TEST_CASE("hierarchical allreduce: every layout, dtype, op and count",
          "[collectives][hierarchical]") {
  const Keys keys = GENERATE(from_range(kLayouts));
  INFO("nodes " << layout_name(keys));
  const int size = static_cast<int>(keys.size());
  const auto groups = make_groups(keys, "allreduce");
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    for (DType dtype : lt::kDTypes) {
      for (lc::ReduceOp op : lt::kOps) {
        for (int64_t n : lt::kCounts) {
          Tensor t = input(g.rank(), n, dtype);
          g.allreduce(t, {.op = op, .timeout = {}})->wait();
          add_failure(failures,
                      mismatch(t, [&](int64_t i) { return expected_value(op, dtype, size, i); },
                               fmt::format("allreduce {} {} n={}", dtype_name(dtype),
                                           lc::to_string(op), n)));
        }
      }
    }
  });
}

TEST_CASE("hierarchical group: broadcast, reduce and barrier by levels, the rest flat",
          "[collectives][hierarchical]") {
  const Keys keys = GENERATE(from_range(kLayouts));
  INFO("nodes " << layout_name(keys));
  const int size = static_cast<int>(keys.size());
  const auto groups = make_groups(keys, "others");
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    const int r = g.rank();
    for (DType dtype : {DType::f32, DType::bf16, DType::i64}) {
      const auto d = dtype_name(dtype);
      for (int64_t n : {int64_t{0}, int64_t{7}, int64_t{1001}}) {
        for (int root = 0; root < size; ++root) {
          Tensor b = input(r, n, dtype);
          g.broadcast(b, {.root = root, .timeout = {}})->wait();
          add_failure(failures, mismatch(b, [&](int64_t i) { return double(input_value(root, i)); },
                                         fmt::format("broadcast {} root {} n={}", d, root, n)));
          for (lc::ReduceOp op : lt::kOps) {
            Tensor t = input(r, n, dtype);
            g.reduce(t, {.op = op, .root = root, .timeout = {}})->wait();
            if (r == root) {
              add_failure(failures, mismatch(t, [&](int64_t i) {
                            return expected_value(op, dtype, size, i);
                          }, fmt::format("reduce {} {} root {} n={}", d, lc::to_string(op), root,
                                         n)));
            }
          }
        }
        Tensor in = input(r, n, dtype);
        Tensor out = Tensor::zeros({n * size}, dtype);
        g.allgather(out, in)->wait();
        add_failure(failures, mismatch(out, [&](int64_t i) {
                      return double(input_value(static_cast<int>(i / n), i % n));
                    }, fmt::format("allgather {} n={}", d, n)));
        for (lc::ReduceOp op : lt::kOps) {
          Tensor full = input(r, n * size, dtype);
          Tensor chunk = Tensor::zeros({n}, dtype);
          g.reduce_scatter(chunk, full, {.op = op, .timeout = {}})->wait();
          add_failure(failures, mismatch(chunk, [&](int64_t i) {
                        return expected_value(op, dtype, size, r * n + i);
                      }, fmt::format("reduce_scatter {} {} n={}", d, lc::to_string(op), n)));
        }
      }
      // A ring of sends and recvs, posted before either is waited for.
      const int next = (r + 1) % size, prev = (r + size - 1) % size;
      Tensor send = input(r, 1001, dtype);
      Tensor recv = Tensor::zeros({1001}, dtype);
      auto sent = g.send(send, next, {.tag = 3, .timeout = {}});
      auto got = g.recv(recv, prev, {.tag = 3, .timeout = {}});
      sent->wait();
      got->wait();
      add_failure(failures, mismatch(recv, [&](int64_t i) { return double(input_value(prev, i)); },
                                     fmt::format("recv {} from {}", d, prev)));
    }
    g.barrier()->wait();
  });
}

TEST_CASE("hierarchical group: collectives in flight complete in issue order",
          "[collectives][hierarchical]") {
  const Keys keys = GENERATE(Keys{"a", "a", "b", "b"}, Keys{"a", "b", "a", "b"});
  INFO("nodes " << layout_name(keys));
  const int size = static_cast<int>(keys.size());
  const auto groups = make_groups(keys, "in-flight");
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    // Eight allreduces with different ops and dtypes, and a broadcast among
    // them, all issued before the first wait.
    std::vector<Tensor> tensors;
    std::vector<std::shared_ptr<lc::Work>> works;
    for (int k = 0; k < 8; ++k) {
      const lc::ReduceOp op = lt::kOps[static_cast<size_t>(k) % lt::kOps.size()];
      tensors.push_back(input(g.rank(), 1001, lt::kDTypes[static_cast<size_t>(k) % 6], k));
      works.push_back(g.allreduce(tensors.back(), {.op = op, .timeout = {}}));
      if (k == 3) {
        tensors.push_back(input(g.rank(), 50, DType::f64));
        works.push_back(g.broadcast(tensors.back(), {.root = size - 1, .timeout = {}}));
      }
    }
    for (size_t w = 0; w < works.size(); ++w) {
      works[w]->wait();
      // Issue order: every earlier collective has completed too.
      for (size_t earlier = 0; earlier < w; ++earlier) {
        if (!works[earlier]->is_completed()) {
          add_failure(failures, fmt::format("collective {} done before {}", w, earlier));
        }
      }
    }
    for (int k = 0, w = 0; k < 8; ++k, ++w) {
      const lc::ReduceOp op = lt::kOps[static_cast<size_t>(k) % lt::kOps.size()];
      const DType dtype = lt::kDTypes[static_cast<size_t>(k) % 6];
      add_failure(failures, mismatch(tensors[static_cast<size_t>(w)], [&](int64_t i) {
                    return expected_value(op, dtype, size, i + k);
                  }, fmt::format("allreduce {} of 8", k)));
      if (k == 3) {
        ++w;
        add_failure(failures, mismatch(tensors[static_cast<size_t>(w)], [&](int64_t i) {
                      return double(input_value(size - 1, i));
                    }, "broadcast among the allreduces"));
      }
    }
  });
}

TEST_CASE("hierarchical group: backend name, one rank, one node", "[collectives][hierarchical]") {
  const auto solo = make_groups({"a"}, "solo");
  CHECK(solo[0]->backend() == "gloo+gloo");
  Tensor t = input(0, 7, DType::i32);
  solo[0]->allreduce(t, {.op = lc::ReduceOp::Avg, .timeout = {}})->wait();
  CHECK(lt::values(t) == lt::values(input(0, 7, DType::i32)));

  const auto one_node = make_groups({"n", "n", "n"}, "one-node");
  on_every_rank(one_node, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    Tensor x = input(g.rank(), 7, DType::f32);
    g.allreduce(x, {.op = lc::ReduceOp::Product, .timeout = {}})->wait();
    add_failure(failures, mismatch(x, [](int64_t i) {
                  return expected_value(lc::ReduceOp::Product, DType::f32, 3, i);
                }, "allreduce on one node"));
  });
}

TEST_CASE("hierarchical group: a rank that never joins; the error names the step",
          "[collectives][hierarchical]") {
  // Nodes {0, 1} and {2, 3}; rank 3 never calls. Rank 2 waits for it in its
  // node's reduce (step 1), rank 0 for rank 2 among the leaders (step 2), and
  // rank 1 for rank 0's broadcast (step 3). Each names the rank it waits for
  // by its rank in this group, not in the node's or the leaders' group.
  // Each rank's timeout ends before that of the rank it waits for, by a
  // margin that load cannot close: a rank that gives up first aborts, and the
  // one waiting for it would report that abort instead of its own timeout
  // (the next test).
  const auto groups = make_groups({"a", "a", "b", "b"}, "late-rank");
  const std::chrono::milliseconds timeouts[] = {2000ms, 1000ms, 3000ms};
  std::latch others_done(3);
  std::vector<std::string> first(4), second(4);
  const auto errors = lt::run_ranks(4, [&](int r) {
    if (r == 3) {  // keeps its group until the others are done
      others_done.wait();
      return;
    }
    Tensor t = Tensor::ones({10});
    auto work = groups[static_cast<size_t>(r)]->allreduce(
        t, {.timeout = timeouts[static_cast<size_t>(r)]});
    first[static_cast<size_t>(r)] = lt::error_of([&] { work->wait(); });
    second[static_cast<size_t>(r)] =
        lt::error_of([&] { groups[static_cast<size_t>(r)]->barrier()->wait(); });
    others_done.count_down();
  });
  for (const auto& e : errors) CHECK(e == nullptr);
  const char* steps[] = {"step 2 of 3", "step 3 of 3", "step 1 of 3"};
  const int awaited[] = {2, 0, 3};
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << first[static_cast<size_t>(r)]);
    CHECK_THAT(first[static_cast<size_t>(r)],
               Contains("allreduce #1") && Contains(steps[r]) && Contains("timed out") &&
                   Contains(fmt::format("rank {} of group 'late-rank' (gloo+gloo, 4 ranks)", r)));
    CHECK_THAT(first[static_cast<size_t>(r)],
               Contains(fmt::format("rank {} of group 'late-rank' (gloo+gloo, 4 ranks) did not "
                                    "join it",
                                    awaited[r])));
    CHECK_THAT(second[static_cast<size_t>(r)], Contains("barrier") && Contains("unusable"));
  }
}

TEST_CASE("hierarchical group: a leader whose peer leader gave up names it by its rank in the "
          "group", "[collectives][hierarchical]") {
  // Nodes {0, 1} and {2, 3}; rank 3 never calls, and rank 2 gives up on it
  // long before rank 0's timeout. Rank 0, waiting for rank 2 among the
  // leaders, fails as soon as rank 2 aborts, with rank 2's reason, naming it
  // as rank 2 of the group (it is rank 1 of the leaders' group).
  const auto groups = make_groups({"a", "a", "b", "b"}, "gave-up");
  std::latch others_done(3);
  std::vector<std::string> seen(4);
  const auto errors = lt::run_ranks(4, [&](int r) {
    if (r == 3) {
      others_done.wait();
      return;
    }
    Tensor t = Tensor::ones({10});
    auto work = groups[static_cast<size_t>(r)]->allreduce(t, {.timeout = r == 2 ? 500ms : 60s});
    seen[static_cast<size_t>(r)] = lt::error_of([&] { work->wait(); });
    others_done.count_down();
  });
  for (const auto& e : errors) CHECK(e == nullptr);
  INFO("rank 0: " << seen[0]);
  CHECK_THAT(seen[0], Contains("step 2 of 3") &&
                          Contains("the group was aborted by rank 2 of group 'gave-up' "
                                   "(gloo+gloo, 4 ranks): ") &&
                          Contains("rank 3 of group 'gave-up' (gloo+gloo, 4 ranks) did not "
                                   "join it"));
  CHECK_THAT(seen[0], !Contains("aborted by rank 1"));
}

TEST_CASE("hierarchical group: an allgather or reduce_scatter against another collective fails "
          "at once", "[collectives][hierarchical]") {
  // The last rank gathers over the flat group while the others all-reduce
  // by levels; a node of two ranks, and nodes of one rank each.
  const Keys keys = GENERATE(Keys{"a", "a", "b", "b"}, Keys{"a", "b"}, Keys{"a", "b", "b"});
  const bool scatter = GENERATE(false, true);
  INFO("nodes " << layout_name(keys) << (scatter ? ", reduce_scatter" : ", allgather"));
  const int size = static_cast<int>(keys.size());
  const auto groups = make_groups(keys, "mismatch", 60s);
  std::vector<std::string> errors_seen(static_cast<size_t>(size));
  const auto errors = lt::run_ranks(size, [&](int r) {
    auto& g = *groups[static_cast<size_t>(r)];
    Tensor chunk = Tensor::ones({4});
    Tensor full = Tensor::ones({4 * size});
    errors_seen[static_cast<size_t>(r)] = lt::error_of([&] {
      if (r < size - 1) {
        g.allreduce(chunk, {.timeout = 8s})->wait();
      } else if (scatter) {
        g.reduce_scatter(chunk, full, {.timeout = 8s})->wait();
      } else {
        g.allgather(full, chunk, {.timeout = 8s})->wait();
      }
    });
  });
  for (const auto& e : errors) CHECK(e == nullptr);
  for (int r = 0; r < size; ++r) {
    INFO("rank " << r << ": " << errors_seen[static_cast<size_t>(r)]);
    CHECK_THAT(errors_seen[static_cast<size_t>(r)],
               Contains("differs across the ranks") || Contains("unusable"));
    CHECK_THAT(errors_seen[static_cast<size_t>(r)], !Contains("timed out"));
  }
}

TEST_CASE("hierarchical group refuses bad input before anything is sent",
          "[collectives][hierarchical]") {
  const auto groups = make_groups({"a", "b"}, "bad-input");
  auto& g = *groups[0];
  Tensor bytes = Tensor::zeros({4}, DType::u8);
  CHECK_THAT(lt::error_of([&] { g.allreduce(bytes, {.op = lc::ReduceOp::Avg, .timeout = {}}); }),
             Contains("Avg of dtype u8 is not supported") && Contains("group 'bad-input'"));
  Tensor t = Tensor::zeros({4});
  CHECK_THAT(lt::error_of([&] { g.broadcast(t, {.root = 2, .timeout = {}}); }),
             Contains("root 2 is not a rank"));
  Tensor small = Tensor::zeros({7});
  CHECK_THAT(lt::error_of([&] { g.allgather(small, t); }),
             Contains("allgather") && Contains("7 elements"));
  CHECK_THAT(lt::error_of([&] { g.reduce_scatter(t, small); }), Contains("reduce_scatter"));
  // Nothing was sent: the group still works.
  on_every_rank(groups, [&](lc::ProcessGroup& pg, std::vector<std::string>& failures) {
    Tensor x = Tensor::full({3}, pg.rank() + 1, DType::i64);
    pg.allreduce(x)->wait();
    add_failure(failures, mismatch(x, [](int64_t) { return 3.0; }, "allreduce after refusals"));
  });
}

// These build the real thing, shm within each node: they pass once the shm
// backend does.
TEST_CASE("make_process_group(\"shm+gloo\"): nodes from the ranks' node keys",
          "[collectives][hierarchical][shm]") {
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  const Keys keys = {"a", "a", "b", "b"};
  std::vector<std::string> results(4);
  const auto errors = lt::run_ranks(4, [&](int r) {
    auto g = lc::make_process_group("shm+gloo", store, r, 4, "hier", 60s,
                                    lockstep::distributed::DebugLevel::Off, keys[static_cast<size_t>(r)]);
    Tensor t = input(r, 1001, DType::f32);
    g->allreduce(t, {.op = lc::ReduceOp::Avg, .timeout = {}})->wait();
    results[static_cast<size_t>(r)] =
        g->backend() + " " +
        mismatch(t, [](int64_t i) { return expected_value(lc::ReduceOp::Avg, DType::f32, 4, i); },
                 "allreduce");
  });
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(lt::message_of(errors[static_cast<size_t>(r)]) == "<no exception>");
    CHECK(results[static_cast<size_t>(r)] == "shm+gloo ");
  }
}

TEST_CASE("shm+gloo: each node's pool serves the reduce within it; a lone rank has none",
          "[collectives][hierarchical][shm][pool]") {
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  const Keys keys = {"a", "a", "a", "b"};
  constexpr int64_t n = 20483;  // past the one-round path
  std::vector<std::string> results(4);
  const auto errors = lt::run_ranks(4, [&](int r) {
    auto g = lc::make_process_group("shm+gloo", store, r, 4, "hier-pool", 60s,
                                    lockstep::distributed::DebugLevel::Off, keys[static_cast<size_t>(r)]);
    auto pool = g->reserve_shared_pool(1 << 20);
    Tensor t = input(r, n, DType::f64);
    if (pool) t = copied_into(*pool, t);
    g->allreduce(t)->wait();
    results[static_cast<size_t>(r)] =
        fmt::format("pool {} ", pool != nullptr) +
        mismatch(t, [](int64_t i) { return expected_value(lc::ReduceOp::Sum, DType::f64, 4, i); },
                 "allreduce");
  });
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(lt::message_of(errors[static_cast<size_t>(r)]) == "<no exception>");
    CHECK(results[static_cast<size_t>(r)] == (r < 3 ? "pool true " : "pool false "));
  }
}

TEST_CASE("shm+gloo: a pool reserved behind collectives in flight joins after them on every rank",
          "[collectives][hierarchical][shm][pool]") {
  // Nodes {0, 1} and {2}. The broadcast from rank 1 is done on rank 1 once its
  // node has the data, while rank 0 still waits for the late rank 2 among the
  // leaders: rank 1 starts the next all-reduce's reduce within the node before
  // the pool is reserved, rank 0 after it. Both must run it without the pool.
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  const Keys keys = {"a", "a", "b"};
  constexpr int64_t n = 200003;  // past the one-round path
  std::vector<std::string> results(3);
  const auto errors = lt::run_ranks(3, [&](int r) {
    auto g = lc::make_process_group("shm+gloo", store, r, 3, "hier-pool-late", 20s,
                                    lockstep::distributed::DebugLevel::Off,
                                    keys[static_cast<size_t>(r)]);
    if (r == 2) std::this_thread::sleep_for(1s);
    Tensor b = input(r, 5, DType::f32);
    auto broadcast = g->broadcast(b, {.root = 1, .timeout = {}});
    std::vector<Tensor> xs;
    std::vector<std::shared_ptr<lc::Work>> works;
    for (int k = 0; k < 3; ++k) {
      xs.push_back(input(r, n, DType::f64, k));
      works.push_back(g->allreduce(xs.back()));
    }
    auto pool = g->reserve_shared_pool(4 << 20);
    broadcast->wait();
    for (auto& w : works) w->wait();
    std::string& result = results[static_cast<size_t>(r)];
    result = fmt::format("pool {} ", pool != nullptr);
    for (int k = 0; k < 3; ++k) {
      result += mismatch(xs[static_cast<size_t>(k)], [&](int64_t i) {
        return expected_value(lc::ReduceOp::Sum, DType::f64, 3, i + k);
      }, fmt::format("allreduce {}", k));
    }
    // The pool serves the collectives after it.
    Tensor t = input(r, n, DType::f64);
    if (pool) t = copied_into(*pool, t);
    g->allreduce(t)->wait();
    result += mismatch(t, [](int64_t i) {
      return expected_value(lc::ReduceOp::Sum, DType::f64, 3, i);
    }, "allreduce after the pool");
  });
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK(lt::message_of(errors[static_cast<size_t>(r)]) == "<no exception>");
    CHECK(results[static_cast<size_t>(r)] == (r < 2 ? "pool true " : "pool false "));
  }
}

TEST_CASE("shm+gloo: a rank that never joins is named by its rank in the group",
          "[collectives][hierarchical][shm]") {
  // Nodes {0, 1} and {2, 3}; rank 3 never calls, and rank 2 waits for it over
  // shm, where rank 3 is the node's rank 1.
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  const Keys keys = {"a", "a", "b", "b"};
  std::latch others_done(3);
  std::string seen;
  const auto errors = lt::run_ranks(4, [&](int r) {
    auto g = lc::make_process_group("shm+gloo", store, r, 4, "hier-late", 60s,
                                    lockstep::distributed::DebugLevel::Off,
                                    keys[static_cast<size_t>(r)]);
    if (r == 3) {
      others_done.wait();
      return;
    }
    Tensor t = Tensor::ones({10});
    auto work = g->allreduce(t, {.timeout = 1500ms});
    const std::string error = lt::error_of([&] { work->wait(); });
    if (r == 2) seen = error;
    others_done.count_down();
  });
  for (const auto& e : errors) CHECK(lt::message_of(e) == "<no exception>");
  INFO(seen);
  CHECK_THAT(seen, Contains("step 1 of 3") &&
                       Contains("rank 3 of group 'hier-late' (shm+gloo, 4 ranks) (pid"));
}

TEST_CASE("make_process_group(\"shm+gloo\") without a node key reads LOCKSTEP_NODE_ID",
          "[collectives][hierarchical][shm]") {
  // Rank 0 names its node "pod-a"; rank 1 names none, and its
  // LOCKSTEP_NODE_ID says "pod-a": one node, whose ranks share a pool.
  const char* before = std::getenv("LOCKSTEP_NODE_ID");
  const std::string saved = before != nullptr ? before : "";
  ::setenv("LOCKSTEP_NODE_ID", "pod-a", 1);
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  std::vector<std::string> results(2);
  const auto errors = lt::run_ranks(2, [&](int r) {
    auto g = lc::make_process_group("shm+gloo", store, r, 2, "hier-env", 60s,
                                    lockstep::distributed::DebugLevel::Off, r == 0 ? "pod-a" : "");
    auto pool = g->reserve_shared_pool(1 << 16);
    Tensor t = input(r, 7, DType::f64);
    g->allreduce(t)->wait();
    results[static_cast<size_t>(r)] =
        fmt::format("pool {} ", pool != nullptr) +
        mismatch(t, [](int64_t i) { return expected_value(lc::ReduceOp::Sum, DType::f64, 2, i); },
                 "allreduce");
  });
  if (before != nullptr) {
    ::setenv("LOCKSTEP_NODE_ID", saved.c_str(), 1);
  } else {
    ::unsetenv("LOCKSTEP_NODE_ID");
  }
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(lt::message_of(errors[static_cast<size_t>(r)]) == "<no exception>");
    CHECK(results[static_cast<size_t>(r)] == "pool true ");
  }
}

TEST_CASE("shm+gloo: a rank whose process exits is named by its rank in the group",
          "[collectives][hierarchical][shm][spawn]") {
  // Nodes {0, 1} and {2, 3}. Rank 3's process ends without a word while rank
  // 2 waits for it over shm, where rank 3 is the node's rank 1; or rank 2's,
  // while rank 0 waits for it among the leaders over gloo, where it is rank 1.
  const int exiting = GENERATE(3, 2);
  const int waiting = exiting == 3 ? 2 : 0;
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / fmt::format("lockstep-hier-exit-{}", ::getpid());
  lc::SpawnOptions options;
  options.env = {{"LOCKSTEP_BACKEND", "shm+gloo"}, {"LOCKSTEP_TIMEOUT_S", "60"}};
  lc::spawn(
      4,
      [&](int r) {
        ::setenv("LOCKSTEP_NODE_ID", r < 2 ? "a" : "b", 1);
        auto g = lc::init_process_group();
        if (r == exiting) std::_Exit(0);
        Tensor t = Tensor::ones({10});
        const std::string error = lt::error_of([&] { g->allreduce(t)->wait(); });
        if (r == waiting) std::ofstream(file) << error;
      },
      options);
  std::ifstream in(file);
  const std::string seen((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(file);
  INFO(seen);
  if (exiting == 3) {
    CHECK_THAT(seen, Contains("rank 3 of group 'default' (shm+gloo, 4 ranks) (pid") &&
                         Contains("exited while rank 2 waited for it"));
  } else {
    CHECK_THAT(seen, Contains("the connection to rank 2 of group 'default' (shm+gloo, 4 ranks) "
                              "broke"));
  }
}

TEST_CASE("init_process_group: the default is shm on one node, shm+gloo across nodes",
          "[collectives][hierarchical][shm]") {
  const auto backends_of = [](const Keys& keys) {
    auto store = std::make_shared<lockstep::distributed::MemoryStore>();
    const int size = static_cast<int>(keys.size());
    std::vector<std::string> backends(keys.size());
    const auto errors = lt::run_ranks(size, [&](int r) {
      lockstep::distributed::RankInfo info;
      info.rank = r;
      info.world_size = size;
      info.local_world_size = size;
      info.node_id = keys[static_cast<size_t>(r)];
      auto g = lc::init_process_group({.timeout = 60s, .rank_info = info, .store = store});
      Tensor t = Tensor::full({5}, r + 1, DType::f32);
      g->allreduce(t)->wait();
      backends[static_cast<size_t>(r)] = fmt::format("{} {}", g->backend(), lt::values(t)[0]);
    });
    for (const auto& e : errors) CHECK(lt::message_of(e) == "<no exception>");
    return backends;
  };
  CHECK(backends_of({"a", "a"}) == std::vector<std::string>(2, "shm 3"));
  CHECK(backends_of({"a", "b", "a"}) == std::vector<std::string>(3, "shm+gloo 6"));
  // One process without a launcher: one node.
  lc::InitOptions solo;
  solo.rank_info = lockstep::distributed::RankInfo{};
  CHECK(lc::init_process_group(solo)->backend() == "shm");
}

#endif  // LOCKSTEP_HAVE_GLOO
