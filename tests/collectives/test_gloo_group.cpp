// The gloo backend in one process: one thread per rank over a MemoryStore.
//
// Inputs and exact expected values come from collective_check.h.
#include <catch2/catch.hpp>

#include "lockstep/config.h"

#if LOCKSTEP_HAVE_GLOO

#include <sched.h>

#include <csignal>

#include <filesystem>
#include <latch>
#include <regex>
#include <string>

#include "collectives/collective_check.h"
#include "collectives/rank_threads.h"
#include "lockstep/collectives/backends.h"
#include "lockstep/collectives/gloo/gloo_group.h"
#include "support/test_util.h"

namespace lc = lockstep::collectives;
namespace lt = lockstep::testing;
using lockstep::runtime::DType;
using lockstep::runtime::Tensor;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

using lt::add_failure;
using lt::expected_value;
using lt::input;
using lt::input_value;
using lt::kCounts;
using lt::kDTypes;
using lt::kOps;
using lt::mismatch;
using lt::on_every_rank;

TEST_CASE("gloo allreduce: every dtype, op and count", "[collectives][gloo]") {
  const int size = GENERATE(2, 4);
  const auto groups = lt::make_groups("gloo", size, "allreduce");
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    for (DType dtype : kDTypes) {
      for (lc::ReduceOp op : kOps) {
        for (int64_t n : kCounts) {
          Tensor t = input(g.rank(), n, dtype);
          g.allreduce(t, {.op = op, .timeout = {}})->wait();
          add_failure(failures, mismatch(t, [&](int64_t i) { return expected_value(op, dtype, size, i); },
                                         fmt::format("allreduce {} {} n={}", dtype_name(dtype),
                                                     lc::to_string(op), n)));
        }
      }
    }
  });
}

TEST_CASE("gloo allreduce: several in flight complete in issue order", "[collectives][gloo]") {
  const auto groups = lt::make_groups("gloo", 2, "in-flight");
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    std::vector<Tensor> tensors;
    std::vector<std::shared_ptr<lc::Work>> works;
    for (int k = 0; k < 8; ++k) {
      tensors.push_back(Tensor::full({33}, k + g.rank(), DType::f32));
      works.push_back(g.allreduce(tensors.back()));
    }
    for (int k = 0; k < 8; ++k) {
      works[static_cast<size_t>(k)]->wait();
      add_failure(failures, mismatch(tensors[static_cast<size_t>(k)],
                                     [&](int64_t) { return 2.0 * k + 1; },
                                     fmt::format("allreduce {} of 8", k)));
    }
  });
}

TEST_CASE("gloo broadcast and reduce from every root", "[collectives][gloo]") {
  const int size = GENERATE(2, 4);
  const auto groups = lt::make_groups("gloo", size, "rooted");
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    for (DType dtype : kDTypes) {
      for (int root = 0; root < size; ++root) {
        for (int64_t n : {int64_t{0}, int64_t{7}, int64_t{1001}}) {
          Tensor b = input(g.rank(), n, dtype);
          g.broadcast(b, {.root = root, .timeout = {}})->wait();
          add_failure(failures, mismatch(b, [&](int64_t i) { return double(input_value(root, i)); },
                                         fmt::format("broadcast {} root {} n={}",
                                                     dtype_name(dtype), root, n)));
          for (lc::ReduceOp op : {lc::ReduceOp::Sum, lc::ReduceOp::Avg, lc::ReduceOp::Max}) {
            Tensor t = input(g.rank(), n, dtype);
            g.reduce(t, {.op = op, .root = root, .timeout = {}})->wait();
            if (g.rank() != root) continue;  // others' contents are unspecified
            add_failure(failures, mismatch(t, [&](int64_t i) { return expected_value(op, dtype, size, i); },
                                           fmt::format("reduce {} {} root {} n={}", dtype_name(dtype),
                                                       lc::to_string(op), root, n)));
          }
        }
      }
    }
  });
}

TEST_CASE("gloo allgather and reduce_scatter", "[collectives][gloo]") {
  const int size = GENERATE(2, 4);
  const auto groups = lt::make_groups("gloo", size, "gather-scatter");
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    for (DType dtype : kDTypes) {
      for (int64_t n : kCounts) {
        Tensor in = input(g.rank(), n, dtype);
        Tensor out = Tensor::zeros({n * size}, dtype);
        g.allgather(out, in)->wait();
        add_failure(failures, mismatch(out, [&](int64_t i) {
                      return double(input_value(static_cast<int>(i / n), i % n));
                    }, fmt::format("allgather {} n={}", dtype_name(dtype), n)));
        for (lc::ReduceOp op : kOps) {
          // Every rank's input has size * n elements; rank r gets chunk r.
          Tensor full = input(g.rank(), n * size, dtype);
          Tensor chunk = Tensor::zeros({n}, dtype);
          g.reduce_scatter(chunk, full, {.op = op, .timeout = {}})->wait();
          add_failure(failures, mismatch(chunk, [&](int64_t i) {
                        return expected_value(op, dtype, size, g.rank() * n + i);
                      }, fmt::format("reduce_scatter {} {} n={}", dtype_name(dtype),
                                     lc::to_string(op), n)));
        }
      }
    }
  });
}

TEST_CASE("gloo barrier and send/recv pairs", "[collectives][gloo]") {
  const int size = GENERATE(2, 4);
  const auto groups = lt::make_groups("gloo", size, "p2p");
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    g.barrier()->wait();
    const int next = (g.rank() + 1) % size;
    const int prev = (g.rank() + size - 1) % size;
    for (DType dtype : kDTypes) {
      // Everyone sends first, then receives: posted at once, so no deadlock.
      Tensor out = input(g.rank(), 1001, dtype);
      Tensor in = Tensor::zeros({1001}, dtype);
      auto sent = g.send(out, next, {.tag = 5, .timeout = {}});
      auto got = g.recv(in, prev, {.tag = 5, .timeout = {}});
      sent->wait();
      got->wait();
      add_failure(failures, mismatch(in, [&](int64_t i) { return double(input_value(prev, i)); },
                                     fmt::format("recv {} from {}", dtype_name(dtype), prev)));
    }
    // Tags keep two messages between the same pair apart.
    if (g.rank() < 2) {
      const int peer = 1 - g.rank();
      Tensor a = Tensor::full({3}, 10 + g.rank(), DType::i32);
      Tensor b = Tensor::full({3}, 20 + g.rank(), DType::i32);
      Tensor ra = Tensor::zeros({3}, DType::i32), rb = Tensor::zeros({3}, DType::i32);
      auto w1 = g.recv(rb, peer, {.tag = 2, .timeout = {}});
      auto w2 = g.recv(ra, peer, {.tag = 1, .timeout = {}});
      g.send(a, peer, {.tag = 1, .timeout = {}})->wait();
      g.send(b, peer, {.tag = 2, .timeout = {}})->wait();
      w1->wait();
      w2->wait();
      add_failure(failures, mismatch(ra, [&](int64_t) { return 10.0 + peer; }, "tag 1"));
      add_failure(failures, mismatch(rb, [&](int64_t) { return 20.0 + peer; }, "tag 2"));
    }
    g.barrier()->wait();
  });
}

// Messages too large to travel inside their header, several on one tag and
// received in another order than sent across tags: each recv gets its own
// message's data, whose slot the header names.
TEST_CASE("gloo: large send/recv messages on several tags, received out of order, each reach "
          "their recv",
          "[collectives][gloo]") {
  const auto groups = lt::make_groups("gloo", 2, "p2p-large");
  constexpr int64_t kCount = 3000;  // 12000 bytes of f32: past the inline limit
  const std::vector<int> tags = {7, 7, 3, 7, 3, 9};
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    const int peer = 1 - g.rank();
    std::vector<std::shared_ptr<lc::Work>> works;
    std::vector<Tensor> got;
    if (g.rank() == 0) {
      std::vector<Tensor> sent;
      for (size_t i = 0; i < tags.size(); ++i) {
        sent.push_back(Tensor::full({kCount}, 100.0 + double(i), DType::f32));
        works.push_back(g.send(sent.back(), peer, {.tag = tags[i], .timeout = {}}));
      }
      for (auto& w : works) w->wait();
      return;
    }
    // Rank 1 posts the tag-9 recv first, then tag 3's, then tag 7's.
    std::vector<size_t> order;
    for (int tag : {9, 3, 7})
      for (size_t i = 0; i < tags.size(); ++i)
        if (tags[i] == tag) order.push_back(i);
    for (size_t i : order) {
      got.push_back(Tensor::zeros({kCount}, DType::f32));
      works.push_back(g.recv(got.back(), peer, {.tag = tags[i], .timeout = {}}));
    }
    for (auto& w : works) w->wait();
    for (size_t k = 0; k < order.size(); ++k) {
      const double want = 100.0 + double(order[k]);
      add_failure(failures, mismatch(got[k], [&](int64_t) { return want; },
                                     fmt::format("message {} on tag {}", order[k],
                                                 tags[order[k]])));
    }
  });
}

TEST_CASE("gloo world size 1 works without peers", "[collectives][gloo]") {
  const auto groups = lt::make_groups("gloo", 1, "solo");
  auto& g = *groups[0];
  Tensor t = input(0, 7, DType::f32);
  g.allreduce(t, {.op = lc::ReduceOp::Avg, .timeout = {}})->wait();
  CHECK(lt::values(t) == lt::values(input(0, 7, DType::f32)));
  Tensor out = Tensor::zeros({7});
  g.allgather(out, t)->wait();
  CHECK(lt::values(out) == lt::values(t));
  g.barrier()->wait();
}

namespace {

// How many of this process's threads run under `policy` (sched_setscheduler(2)).
int threads_with_policy(int policy) {
  int count = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    const auto tid = static_cast<pid_t>(std::stol(task.path().filename().string()));
    if (sched_getscheduler(tid) == policy) ++count;
  }
  return count;
}

}  // namespace

// gloo's event loop only try-locks a connection and spins while a sender
// holds it; woken onto the sender's core, it used to preempt the sender and
// spin until the scheduler's next tick (4 ms a collective with ranks bound
// to cores). As SCHED_BATCH it does not preempt on wake-up.
TEST_CASE("gloo: the event loop thread does not preempt on wake-up; the caller keeps its policy",
          "[collectives][gloo]") {
  REQUIRE(sched_getscheduler(0) == SCHED_OTHER);
  const int before = threads_with_policy(SCHED_BATCH);
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  auto group = lc::make_process_group("gloo", store, 0, 1, "loop-policy", 60s);
  CHECK(threads_with_policy(SCHED_BATCH) == before + 1);
  CHECK(sched_getscheduler(0) == SCHED_OTHER);
  Tensor t = Tensor::ones({5});
  group->allreduce(t)->wait();
  CHECK(lt::values(t) == lt::values(Tensor::ones({5})));
}

TEST_CASE("gloo: a rank that never joins gives a timeout naming op, rank and group",
          "[collectives][gloo]") {
  const auto groups = lt::make_groups("gloo", 2, "late-rank");
  std::latch rank1_done(1);
  std::string first, second;
  const auto errors = lt::run_ranks(2, [&](int r) {
    if (r == 0) {  // never calls the collective; keeps its group until rank 1 is done
      rank1_done.wait();
      return;
    }
    Tensor t = Tensor::ones({10});
    auto work = groups[1]->allreduce(t, {.timeout = 1500ms});
    first = lt::error_of([&] { work->wait(); });
    // The group is aborted now: later calls fail at once, saying why.
    second = lt::error_of([&] { groups[1]->barrier()->wait(); });
    rank1_done.count_down();
  });
  CHECK(errors[0] == nullptr);
  CHECK(errors[1] == nullptr);
  CHECK_THAT(first, Contains("allreduce #1") && Contains("timed out") && Contains("rank 1") &&
                        Contains("group 'late-rank'"));
  CHECK_THAT(second, Contains("barrier") && Contains("unusable") && Contains("allreduce #1"));
}

TEST_CASE("gloo refuses bad input before anything is sent", "[collectives][gloo]") {
  const auto groups = lt::make_groups("gloo", 2, "bad-input");
  auto& g = *groups[0];
  Tensor bytes = Tensor::zeros({4}, DType::u8);
  CHECK_THAT(lt::error_of([&] { g.allreduce(bytes, {.op = lc::ReduceOp::Avg, .timeout = {}}); }),
             Contains("Avg of dtype u8 is not supported") && Contains("group 'bad-input'"));
  Tensor strided = Tensor::zeros({4, 4}).t();
  CHECK_THAT(lt::error_of([&] { g.allreduce(strided); }), Contains("contiguous"));
  Tensor t = Tensor::zeros({4});
  CHECK_THAT(lt::error_of([&] { g.broadcast(t, {.root = 2, .timeout = {}}); }),
             Contains("root 2 is not a rank"));
  CHECK_THAT(lt::error_of([&] { g.reduce(t, {.root = -1, .timeout = {}}); }), Contains("root -1"));
  Tensor small = Tensor::zeros({7});
  CHECK_THAT(lt::error_of([&] { g.allgather(small, t); }),
             Contains("allgather") && Contains("7 elements") && Contains("8"));
  Tensor wrong_type = Tensor::zeros({8}, DType::f64);
  CHECK_THAT(lt::error_of([&] { g.allgather(wrong_type, t); }), Contains("dtype"));
  CHECK_THAT(lt::error_of([&] { g.reduce_scatter(t, small); }), Contains("reduce_scatter"));
  CHECK_THAT(lt::error_of([&] { g.send(t, 0); }), Contains("another rank"));
  CHECK_THAT(lt::error_of([&] { g.recv(t, 5); }), Contains("peer 5"));
  // Nothing was sent: the group still works for both ranks.
  on_every_rank(groups, [&](lc::ProcessGroup& pg, std::vector<std::string>& failures) {
    Tensor x = Tensor::full({3}, pg.rank() + 1, DType::i64);
    pg.allreduce(x)->wait();
    add_failure(failures, mismatch(x, [](int64_t) { return 3.0; }, "allreduce after refusals"));
  });
}

TEST_CASE("gloo: a group made again under the same name on the same store",
          "[collectives][gloo]") {
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  for (int round = 0; round < 2; ++round) {
    std::vector<std::string> results(2);
    const auto errors = lt::run_ranks(2, [&](int r) {
      auto g = lc::make_process_group("gloo", store, r, 2, "again", 30s);
      Tensor t = Tensor::full({4}, r + round, DType::f32);
      g->allreduce(t)->wait();
      results[static_cast<size_t>(r)] = fmt::format("{}", lt::values(t)[0]);
    });
    CHECK(errors[0] == nullptr);
    CHECK(errors[1] == nullptr);
    CHECK(results[0] == fmt::format("{}", 1 + 2 * round));
    CHECK(results[1] == results[0]);
  }
}

TEST_CASE("gloo: a peer whose group goes away is named in the error", "[collectives][gloo]") {
  const int size = GENERATE(2, 3);
  const int gone_rank = size - 1;
  auto groups = lt::make_groups("gloo", size, "peer-gone");
  std::latch gone(1);
  std::string seen;
  const auto errors = lt::run_ranks(size, [&](int r) {
    groups[static_cast<size_t>(r)]->barrier()->wait();
    if (r == gone_rank) {  // as if the process died: its connections close
      groups[static_cast<size_t>(r)].reset();
      gone.count_down();
      return;
    }
    gone.wait();
    Tensor t = Tensor::ones({100});
    const std::string error =
        lt::error_of([&] { groups[static_cast<size_t>(r)]->allreduce(t)->wait(); });
    if (r == 0) seen = error;
  });
  for (const auto& e : errors) CHECK(e == nullptr);
  CHECK_THAT(seen, Contains("allreduce #2") && Contains("rank 0 of group 'peer-gone'"));
  // gloo reports the peer's address; the error names the rank when that is
  // the peer's listening address (this side connected) or the only peer.
  if (size == 2) {
    CHECK_THAT(seen, Contains(fmt::format("the connection to rank {} broke", gone_rank)));
  }
  // With 3 ranks, rank 1 may see the loss first and abort: rank 0's own
  // connection to rank 1 then breaks, and its error says rank 1 aborted (and
  // why). Every rank named as lost is the gone one, or one that aborted.
  const std::regex lost("the connection to rank (\\d+) broke");
  for (auto it = std::sregex_iterator(seen.begin(), seen.end(), lost);
       it != std::sregex_iterator(); ++it) {
    const int named = std::stoi((*it)[1]);
    INFO("named rank " << named);
    CHECK((named == gone_rank ||
           seen.find(fmt::format("aborted by rank {}", named)) != std::string::npos));
  }
}

TEST_CASE("make_process_group: unknown and missing backends are explained", "[collectives]") {
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  CHECK_THAT(lt::error_of([&] { lc::make_process_group("tcp", store, 0, 1, "x", 1s); }),
             Contains("unknown collectives backend 'tcp'; the backends are gloo, mpi, nccl, shm "
                      "and shm+gloo (built into this lockstep: ") &&
                 Contains("LOCKSTEP_BACKEND"));
  for (const char* backend : {"gloo", "mpi", "nccl"}) {
    if (lc::is_built_in(backend)) continue;
    CHECK_THAT(lt::error_of([&] { lc::make_process_group(backend, store, 0, 1, "x", 1s); }),
               Contains("is not built into") && Contains(lc::how_to_enable(backend)));
  }
}

TEST_CASE("init_process_group: defaults, one process without a store, clear errors",
          "[collectives][gloo]") {
  lc::InitOptions options;
  options.rank_info = lockstep::distributed::RankInfo{};  // one process, no launcher
  auto g = lc::init_process_group(options);
  CHECK(g->backend() == "shm");  // the default on one node
  CHECK(g->size() == 1);
  CHECK(g->timeout() == lc::ProcessGroup::kDefaultTimeout);
  Tensor t = Tensor::full({3}, 2.0);
  g->allreduce(t)->wait();
  CHECK(lt::values(t) == std::vector<double>{2.0, 2.0, 2.0});

  options.backend = "tcp";
  CHECK_THAT(lt::error_of([&] { lc::init_process_group(options); }),
             Contains("unknown collectives backend 'tcp'"));

  lockstep::distributed::RankInfo many;
  many.world_size = 2;
  many.local_world_size = 2;
  many.source = "slurm";
  options.backend = "";
  options.rank_info = many;
  options.timeout = 2s;
  CHECK_THAT(lt::error_of([&] { lc::init_process_group(options); }),
             Contains("no store address") && Contains("LOCKSTEP_STORE_ADDR"));
}

TEST_CASE("gloo: an unmatched recv times out; a pending one is cancelled with its group",
          "[collectives][gloo]") {
  auto groups = lt::make_groups("gloo", 2, "unmatched");
  Tensor t = Tensor::zeros({5});
  CHECK_THAT(lt::error_of([&] { groups[1]->recv(t, 0, {.tag = 3, .timeout = 500ms})->wait(); }),
             Contains("recv (f32, 5 elements, from rank 0, tag 3) timed out") &&
                 Contains("rank 1 of group 'unmatched'"));
  // Fresh groups: after a timeout gloo may break the pair's connection.
  auto fresh = lt::make_groups("gloo", 2, "cancelled");
  Tensor u = Tensor::zeros({5});
  auto pending = fresh[0]->recv(u, 1, {.tag = 4, .timeout = {}});
  fresh[0].reset();  // must not wait for the 60 s timeout
  CHECK_THAT(lt::error_of([&] { pending->wait(); }), Contains("destroyed"));
}

TEST_CASE("gloo: a process with a gloo group ignores SIGPIPE unless it handles it itself",
          "[collectives][gloo]") {
  // gloo's writev() to a peer that has gone raises SIGPIPE: by its default
  // action the rank died ("killed by SIGPIPE") before gloo's error named the
  // peer. Python, and so PyTorch, ignores it.
  struct sigaction saved {};
  ::sigaction(SIGPIPE, nullptr, &saved);
  const auto disposition_after_group = [](void (*before)(int)) {
    ::signal(SIGPIPE, before);
    lt::make_groups("gloo", 1, "sigpipe");
    struct sigaction now {};
    ::sigaction(SIGPIPE, nullptr, &now);
    return now.sa_handler;
  };
  CHECK(disposition_after_group(SIG_DFL) == SIG_IGN);
  void (*handler)(int) = [](int) {};
  CHECK(disposition_after_group(handler) == handler);  // the program's own choice stays
  ::sigaction(SIGPIPE, &saved, nullptr);
}

#endif  // LOCKSTEP_HAVE_GLOO
