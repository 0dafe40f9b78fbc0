// The shm backend in one process: one thread per rank over a MemoryStore, at
// world sizes 2, 3 and 4. Every collective, op and dtype with exact expected
// values (collective_check.h), at counts that are zero, tiny, not divisible by
// the world size, and large enough to need many rounds through a small staging
// buffer; several collectives in flight; thousands of back-to-back small
// collectives; the group's timeout; and that /dev/shm is left clean.
#include <catch2/catch.hpp>

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <latch>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "collectives/collective_check.h"
#include "collectives/rank_threads.h"
#include "lockstep/collectives/shm/shm_group.h"
#include "lockstep/collectives/shm/shm_rendezvous.h"
#include "lockstep/collectives/shm/shm_segment.h"
#include "lockstep/collectives/work.h"
#include "lockstep/distributed/store/memory_store.h"
#include "support/test_util.h"

namespace lc = lockstep::collectives;
namespace lt = lockstep::testing;
using lockstep::runtime::DType;
using lockstep::runtime::Tensor;
using lt::add_failure;
using lt::expected_value;
using lt::input;
using lt::input_value;
using lt::kDTypes;
using lt::kOps;
using lt::mismatch;
using lt::on_every_rank;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

namespace {

// The backend the bodies below run on. They use only the ProcessGroup
// interface (and expect what any backend must give), so naming another
// backend here runs the same checks against it; the /dev/shm ones are shm's.
const std::string kBackend = "shm";

using Groups = std::vector<std::shared_ptr<lc::ProcessGroup>>;

// Counts for a group of `size`: zero, one, a few, and counts not divisible by
// the size (on both sides of a multiple of it), plus one that is.
std::vector<int64_t> counts_for(int size) {
  return {0, 1, size - 1, size + 1, 7, 8 * size, 8 * size + 3, 1001};
}

// Groups made through make_shm_group directly, with `options` (other
// backends: their plain groups).
Groups make_shm_groups(int size, const std::string& name, const lc::ShmOptions& options,
                       std::chrono::milliseconds timeout = 60s) {
  if (kBackend != "shm") return lt::make_groups(kBackend, size, name, timeout);
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  Groups groups(static_cast<size_t>(size));
  const auto errors = lt::run_ranks(size, [&](int r) {
    groups[static_cast<size_t>(r)] = lc::make_shm_group(store, r, size, name, timeout, options);
  });
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return groups;
}

void check_backend(lc::ProcessGroup& g, std::vector<std::string>& failures) {
  if (g.backend() != kBackend) {
    failures.push_back(fmt::format("backend() is '{}', expected '{}'", g.backend(), kBackend));
  }
}

std::string reduced_mismatch(const Tensor& t, lc::ReduceOp op, DType dtype, int size,
                             int64_t offset, const std::string& what) {
  return mismatch(t, [&](int64_t i) { return expected_value(op, dtype, size, offset + i); }, what);
}

// Every collective once on `g` at count `n` of `dtype` (and every op where
// there is one), each result checked.
void every_collective(lc::ProcessGroup& g, std::vector<std::string>& failures, DType dtype,
                      int64_t n, const std::vector<lc::ReduceOp>& ops) {
  const int size = g.size(), rank = g.rank();
  const auto name = dtype_name(dtype);
  for (lc::ReduceOp op : ops) {
    Tensor t = input(rank, n, dtype);
    g.allreduce(t, {.op = op, .timeout = {}})->wait();
    add_failure(failures, reduced_mismatch(t, op, dtype, size, 0,
                                           fmt::format("allreduce {} {} n={}", name,
                                                       lc::to_string(op), n)));
  }
  for (int root = 0; root < size; ++root) {
    Tensor b = input(rank, n, dtype);
    g.broadcast(b, {.root = root, .timeout = {}})->wait();
    add_failure(failures, mismatch(b, [&](int64_t i) { return double(input_value(root, i)); },
                                   fmt::format("broadcast {} root {} n={}", name, root, n)));
    for (lc::ReduceOp op : ops) {
      Tensor t = input(rank, n, dtype);
      g.reduce(t, {.op = op, .root = root, .timeout = {}})->wait();
      if (rank != root) continue;  // others' contents are unspecified
      add_failure(failures, reduced_mismatch(t, op, dtype, size, 0,
                                             fmt::format("reduce {} {} root {} n={}", name,
                                                         lc::to_string(op), root, n)));
    }
  }
  Tensor in = input(rank, n, dtype);
  Tensor out = Tensor::full({n * size}, 99, dtype);
  g.allgather(out, in)->wait();
  add_failure(failures, mismatch(out, [&](int64_t i) {
                return double(input_value(static_cast<int>(i / n), i % n));
              }, fmt::format("allgather {} n={}", name, n)));
  for (lc::ReduceOp op : ops) {
    // Every rank's input has size * n elements; rank r gets chunk r.
    Tensor full = input(rank, n * size, dtype);
    Tensor chunk = Tensor::full({n}, 99, dtype);
    g.reduce_scatter(chunk, full, {.op = op, .timeout = {}})->wait();
    add_failure(failures, reduced_mismatch(chunk, op, dtype, size, rank * n,
                                           fmt::format("reduce_scatter {} {} n={}", name,
                                                       lc::to_string(op), n)));
  }
}

// The /dev/shm files whose names start with `prefix`.
std::vector<std::string> shm_files(const std::string& prefix) {
  std::vector<std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) found.push_back(name);
  }
  return found;
}

bool shm_file_exists(const std::string& segment_name) {  // "/lockstep-..."
  return std::filesystem::exists("/dev/shm" + segment_name);
}

// This process's segments: what its shm groups (rank 0 here) would name.
std::string own_prefix() {
  return lc::shm::segment_prefix() + std::to_string(::getpid()) + "-";
}

}  // namespace

TEST_CASE("shm allreduce: every op, dtype and count", "[collectives][shm]") {
  const int size = GENERATE(2, 3, 4);
  const auto groups = lt::make_groups(kBackend, size, "allreduce");
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    check_backend(g, failures);
    for (DType dtype : kDTypes) {
      for (lc::ReduceOp op : kOps) {
        for (int64_t n : counts_for(size)) {
          Tensor t = input(g.rank(), n, dtype);
          g.allreduce(t, {.op = op, .timeout = {}})->wait();
          add_failure(failures, reduced_mismatch(t, op, dtype, size, 0,
                                                 fmt::format("allreduce {} {} n={}",
                                                             dtype_name(dtype), lc::to_string(op),
                                                             n)));
        }
      }
    }
  });
}

TEST_CASE("shm broadcast and reduce: every root, op, dtype and count", "[collectives][shm]") {
  const int size = GENERATE(2, 3, 4);
  const auto groups = lt::make_groups(kBackend, size, "rooted");
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    for (DType dtype : kDTypes) {
      for (int root = 0; root < size; ++root) {
        for (int64_t n : counts_for(size)) {
          Tensor b = input(g.rank(), n, dtype);
          g.broadcast(b, {.root = root, .timeout = {}})->wait();
          add_failure(failures, mismatch(b, [&](int64_t i) { return double(input_value(root, i)); },
                                         fmt::format("broadcast {} root {} n={}",
                                                     dtype_name(dtype), root, n)));
          for (lc::ReduceOp op : kOps) {
            Tensor t = input(g.rank(), n, dtype);
            g.reduce(t, {.op = op, .root = root, .timeout = {}})->wait();
            if (g.rank() != root) continue;  // others' contents are unspecified
            add_failure(failures, reduced_mismatch(t, op, dtype, size, 0,
                                                   fmt::format("reduce {} {} root {} n={}",
                                                               dtype_name(dtype),
                                                               lc::to_string(op), root, n)));
          }
        }
      }
    }
  });
}

TEST_CASE("shm allgather and reduce_scatter: every op, dtype and count", "[collectives][shm]") {
  const int size = GENERATE(2, 3, 4);
  const auto groups = lt::make_groups(kBackend, size, "gather-scatter");
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    for (DType dtype : kDTypes) {
      for (int64_t n : counts_for(size)) {
        Tensor in = input(g.rank(), n, dtype);
        Tensor out = Tensor::full({n * size}, 99, dtype);
        g.allgather(out, in)->wait();
        add_failure(failures, mismatch(out, [&](int64_t i) {
                      return double(input_value(static_cast<int>(i / n), i % n));
                    }, fmt::format("allgather {} n={}", dtype_name(dtype), n)));
        for (lc::ReduceOp op : kOps) {
          Tensor full = input(g.rank(), n * size, dtype);
          Tensor chunk = Tensor::full({n}, 99, dtype);
          g.reduce_scatter(chunk, full, {.op = op, .timeout = {}})->wait();
          add_failure(failures, reduced_mismatch(chunk, op, dtype, size, g.rank() * n,
                                                 fmt::format("reduce_scatter {} {} n={}",
                                                             dtype_name(dtype), lc::to_string(op),
                                                             n)));
        }
      }
    }
  });
}

TEST_CASE("shm barrier: no rank leaves before every rank has arrived", "[collectives][shm]") {
  const int size = GENERATE(2, 3, 4);
  const auto groups = lt::make_groups(kBackend, size, "barrier");
  constexpr int kRounds = 200;
  std::atomic<int> arrived{0};
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    for (int round = 0; round < kRounds; ++round) {
      arrived.fetch_add(1);
      g.barrier()->wait();
      // Every rank has arrived for this round, and none can arrive for the
      // next one before this rank reaches the second barrier.
      const int seen = arrived.load();
      if (seen != size * (round + 1)) {
        failures.push_back(fmt::format("barrier round {}: {} arrivals seen, expected {}", round,
                                       seen, size * (round + 1)));
      }
      g.barrier()->wait();
    }
  });
  CHECK(arrived.load() == size * kRounds);
}

TEST_CASE("shm world size 1 works without peers", "[collectives][shm]") {
  const auto groups = lt::make_groups(kBackend, 1, "solo");
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    check_backend(g, failures);
    for (DType dtype : kDTypes) {
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1001}}) {
        every_collective(g, failures, dtype, n, kOps);
      }
    }
    g.barrier()->wait();
  });
}

TEST_CASE("shm small staging buffer: every collective over many rounds", "[collectives][shm]") {
  const int size = GENERATE(2, 3, 4);
  const auto groups = make_shm_groups(size, "small-buffer", {.buffer_bytes = 4096});
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    check_backend(g, failures);
    // 12007 elements of 4 or 8 bytes: about 12 or 24 buffer-fulls, and a
    // count divisible by none of 2, 3 and 4.
    constexpr int64_t n = 12007;
    for (DType dtype : {DType::f32, DType::i64, DType::bf16}) {
      every_collective(g, failures, dtype, n, {lc::ReduceOp::Sum});
    }
    every_collective(g, failures, DType::f64, n, kOps);
    // Just over one buffer-full, and one element.
    for (int64_t m : {int64_t{4096 / 4 + 1}, int64_t{1}}) {
      every_collective(g, failures, DType::f32, m, {lc::ReduceOp::Max});
    }
  });
}

TEST_CASE("shm allreduce of 4M f32 elements with the default buffer", "[collectives][shm]") {
  const int size = GENERATE(2, 3, 4);
  const auto groups = lt::make_groups(kBackend, size, "large");
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    constexpr int64_t n = 4'000'037;
    Tensor t = input(g.rank(), n, DType::f32);
    g.allreduce(t)->wait();
    add_failure(failures, reduced_mismatch(t, lc::ReduceOp::Sum, DType::f32, size, 0,
                                           "allreduce f32 sum n=4000037"));
  });
}

TEST_CASE("shm: several collectives in flight complete in issue order", "[collectives][shm]") {
  const int size = GENERATE(2, 3, 4);
  const bool reverse = GENERATE(false, true);  // wait in issue order, or last first
  INFO("waiting " << (reverse ? "last first" : "in issue order"));
  const auto groups = lt::make_groups(kBackend, size, "in-flight");
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    constexpr int kInFlight = 8;
    std::vector<Tensor> tensors;
    std::vector<std::shared_ptr<lc::Work>> works;
    for (int k = 0; k < kInFlight; ++k) {
      const DType dtype = kDTypes[static_cast<size_t>(k) % kDTypes.size()];
      const lc::ReduceOp op = kOps[static_cast<size_t>(k) % kOps.size()];
      tensors.push_back(input(g.rank(), 37 * k + 1, dtype, k));
      works.push_back(g.allreduce(tensors.back(), {.op = op, .timeout = {}}));
    }
    for (int j = 0; j < kInFlight; ++j) {
      works[static_cast<size_t>(reverse ? kInFlight - 1 - j : j)]->wait();
    }
    for (int k = 0; k < kInFlight; ++k) {
      const DType dtype = kDTypes[static_cast<size_t>(k) % kDTypes.size()];
      const lc::ReduceOp op = kOps[static_cast<size_t>(k) % kOps.size()];
      if (!works[static_cast<size_t>(k)]->is_completed()) {
        failures.push_back(fmt::format("allreduce {} not completed after wait()", k));
      }
      add_failure(failures, reduced_mismatch(tensors[static_cast<size_t>(k)], op, dtype, size, k,
                                             fmt::format("allreduce {} of {}", k, kInFlight)));
    }

    // Different collectives in flight together.
    const int rank = g.rank();
    Tensor a = input(rank, 1001, DType::f32);
    Tensor b = input(rank, 5, DType::i64);
    Tensor gathered = Tensor::zeros({3 * size}, DType::f16);
    Tensor c = input(rank, 3, DType::f16);
    Tensor scattered = Tensor::zeros({7}, DType::f64);
    Tensor full = input(rank, 7 * size, DType::f64);
    std::vector<std::shared_ptr<lc::Work>> mixed = {
        g.allreduce(a, {.op = lc::ReduceOp::Min, .timeout = {}}),
        g.broadcast(b, {.root = size - 1, .timeout = {}}),
        g.barrier(),
        g.allgather(gathered, c),
        g.reduce_scatter(scattered, full, {.op = lc::ReduceOp::Product, .timeout = {}}),
    };
    for (size_t j = 0; j < mixed.size(); ++j) mixed[reverse ? mixed.size() - 1 - j : j]->wait();
    add_failure(failures, reduced_mismatch(a, lc::ReduceOp::Min, DType::f32, size, 0, "mixed allreduce"));
    add_failure(failures, mismatch(b, [&](int64_t i) { return double(input_value(size - 1, i)); },
                                   "mixed broadcast"));
    add_failure(failures, mismatch(gathered, [&](int64_t i) {
                  return double(input_value(static_cast<int>(i / 3), i % 3));
                }, "mixed allgather"));
    add_failure(failures, reduced_mismatch(scattered, lc::ReduceOp::Product, DType::f64, size,
                                           rank * 7, "mixed reduce_scatter"));
  });
}

TEST_CASE("shm stress: 5000 back-to-back small collectives, each checked", "[collectives][shm]") {
  const int size = GENERATE(2, 3, 4);
  const auto groups = lt::make_groups(kBackend, size, "stress");
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    const int rank = g.rank();
    std::mt19937 rng(12345);  // the same sequence of calls on every rank
    for (int it = 0; it < 5000; ++it) {  // every rank makes every call, even after a failure
      const DType dtype = kDTypes[rng() % kDTypes.size()];
      const int64_t n = 1 + static_cast<int64_t>(rng() % 64);
      const int64_t offset = it;  // different data every call
      const auto what = [&](const char* op) {
        return fmt::format("call {}: {} {} n={}", it, op, dtype_name(dtype), n);
      };
      switch (rng() % 6) {
        case 0:
        case 1:
        case 2: {
          const lc::ReduceOp op = kOps[rng() % kOps.size()];
          Tensor t = input(rank, n, dtype, offset);
          g.allreduce(t, {.op = op, .timeout = {}})->wait();
          add_failure(failures, reduced_mismatch(t, op, dtype, size, offset, what("allreduce")));
          break;
        }
        case 3: {
          const int root = static_cast<int>(rng() % static_cast<unsigned>(size));
          Tensor t = input(rank, n, dtype, offset);
          g.broadcast(t, {.root = root, .timeout = {}})->wait();
          add_failure(failures, mismatch(t, [&](int64_t i) {
                        return double(input_value(root, offset + i));
                      }, what("broadcast")));
          break;
        }
        case 4: {
          Tensor in = input(rank, n, dtype, offset);
          Tensor out = Tensor::full({n * size}, 99, dtype);
          g.allgather(out, in)->wait();
          add_failure(failures, mismatch(out, [&](int64_t i) {
                        return double(input_value(static_cast<int>(i / n), offset + i % n));
                      }, what("allgather")));
          break;
        }
        default:
          g.barrier()->wait();
          break;
      }
    }
  });
}

TEST_CASE("shm: a rank that never joins gives a timeout naming the op; the group is then unusable",
          "[collectives][shm]") {
  // The group's own timeout, or the call's.
  const bool group_timeout = GENERATE(true, false);
  INFO((group_timeout ? "group timeout 1 s" : "call timeout 1 s, group timeout 60 s"));
  const int size = 3, absent = 2;
  const auto start = std::chrono::steady_clock::now();
  {
    const auto groups = lt::make_groups(kBackend, size, "late-rank", group_timeout ? 1s : 60s);
    std::latch others_done(size - 1);
    std::vector<std::string> first(size), second(size), types(size);
    std::vector<double> waited(size);
    const auto errors = lt::run_ranks(size, [&](int r) {
      auto& g = *groups[static_cast<size_t>(r)];
      g.barrier()->wait();
      if (r == absent) {  // never calls the allreduce; keeps its group until the others are done
        others_done.wait();
        return;
      }
      Tensor t = Tensor::ones({1000});
      const auto issued = std::chrono::steady_clock::now();
      auto work = g.allreduce(t, {.op = lc::ReduceOp::Sum,
                                  .timeout = group_timeout ? lc::Timeout{} : lc::Timeout{1s}});
      try {
        work->wait();
        first[static_cast<size_t>(r)] = "<no exception>";
      } catch (const lc::CollectiveError& e) {
        first[static_cast<size_t>(r)] = e.what();
        types[static_cast<size_t>(r)] = "CollectiveError";
      } catch (const std::exception& e) {
        first[static_cast<size_t>(r)] = e.what();
        types[static_cast<size_t>(r)] = "other";
      }
      waited[static_cast<size_t>(r)] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - issued).count();
      // The group is aborted now: later calls fail, at once or on wait().
      Tensor u = Tensor::ones({10});
      second[static_cast<size_t>(r)] = lt::error_of([&] { g.allreduce(u)->wait(); });
      others_done.count_down();
    });
    for (int r = 0; r < size; ++r) {
      INFO("rank " << r);
      CHECK(lt::message_of(errors[static_cast<size_t>(r)]) == "<no exception>");
      if (r == absent) continue;
      const auto& message = first[static_cast<size_t>(r)];
      CHECK(types[static_cast<size_t>(r)] == "CollectiveError");
      CHECK_THAT(message, Contains("allreduce #2") && Contains("timed out") &&
                              Contains(fmt::format("rank {}", r)) &&
                              Contains("group 'late-rank'"));
      CHECK(waited[static_cast<size_t>(r)] < 20.0);
      CHECK_THAT(second[static_cast<size_t>(r)],
                 !Contains("<no exception>") && (Contains("unusable") || Contains("aborted")));
    }
    // The timeout was honoured, not cut short: the rank whose deadline came
    // first waited all of it (the others may learn of its abort a little
    // before their own deadlines).
    CHECK(std::max(waited[0], waited[1]) >= 0.95);
  }  // the groups are destroyed here, the aborted ones included
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds < 30.0);
}

TEST_CASE("shm groups leave no /dev/shm file behind", "[collectives][shm]") {
  const int size = GENERATE(1, 2, 3, 4);
  {
    const auto groups = lt::make_groups(kBackend, size, "clean");
    // Every rank has mapped the segment once construction returns: its name
    // is gone already.
    CHECK(shm_files(own_prefix()).empty());
    on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
      Tensor t = input(g.rank(), 1001, DType::f32);
      g.allreduce(t)->wait();
      add_failure(failures, reduced_mismatch(t, lc::ReduceOp::Sum, DType::f32, size, 0,
                                             "allreduce"));
    });
    CHECK(shm_files(own_prefix()).empty());
    const auto small = make_shm_groups(size, "clean-small", {.buffer_bytes = 4096});
    CHECK(shm_files(own_prefix()).empty());
  }
  CHECK(shm_files(own_prefix()).empty());
}

TEST_CASE("shm: a dead process's segment is removed, a live one's is kept", "[collectives][shm]") {
  const bool through_group = GENERATE(false, true);
  INFO((through_group ? "removed by making an shm group" : "removed by remove_stale_segments()"));
  // A segment of this live process, which no sweep may remove. Made first:
  // Segment::create() sweeps stale segments itself.
  const std::string live = fmt::format("/{}live-test-{}", lc::shm::segment_prefix(), ::getpid());
  auto segment = lc::shm::Segment::create(live, 1 << 16);
  REQUIRE(shm_file_exists(live));

  // A child creates a segment and exits without unlinking it, as a crashed
  // rank 0 would.
  const std::string stale = fmt::format("/{}stale-test-{}-{}", lc::shm::segment_prefix(),
                                        ::getpid(), through_group ? "group" : "call");
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    try {
      auto segment = lc::shm::Segment::create(stale, 1 << 16);
      ::_exit(0);  // no destructor, no unlink: the name stays, as after a crash
    } catch (...) {
      ::_exit(2);
    }
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);  // reaped: no zombie holds the pid
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  REQUIRE(shm_file_exists(stale));

  if (through_group) {
    const auto groups = lt::make_groups("shm", 2, "after-crash");
    on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
      Tensor t = input(g.rank(), 7, DType::i32);
      g.allreduce(t)->wait();
      add_failure(failures, reduced_mismatch(t, lc::ReduceOp::Sum, DType::i32, 2, 0, "allreduce"));
    });
  } else {
    CHECK(lc::shm::remove_stale_segments() >= 1);
  }
  CHECK_FALSE(shm_file_exists(stale));
  CHECK(shm_file_exists(live));
  lc::shm::remove_stale_segments();  // again: a live creator's segment is never stale
  CHECK(shm_file_exists(live));

  segment.unlink();
  CHECK_FALSE(shm_file_exists(live));
}

TEST_CASE("shm: a segment /dev/shm cannot hold fails every rank, naming gloo as the way out",
          "[collectives][shm]") {
  // Staging buffers of 1 TiB per rank: far more than /dev/shm holds anywhere.
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  const auto errors = lt::run_ranks(2, [&](int r) {
    lc::make_shm_group(store, r, 2, "too-big", 30s, {.buffer_bytes = size_t{1} << 40});
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK_THAT(lt::message_of(errors[static_cast<size_t>(r)]),
               Contains("rank 0 could not create the shared segment") &&
                   Contains("/dev/shm") && Contains("LOCKSTEP_BACKEND=gloo"));
    // How big /dev/shm is, so the user knows how far to raise it.
    CHECK_THAT(lt::message_of(errors[static_cast<size_t>(r)]),
               Contains("/dev/shm holds") && Contains("MiB of it free") &&
                   Contains("--shm-size"));
  }
}

TEST_CASE("shm allreduce Max and Min: a NaN on any rank wins, at every size and position",
          "[collectives][shm]") {
  // Through the one-round path (8 values) and the sliced one (2^20); the NaN
  // on a rank other than 0, at the first and the last index.
  const auto groups = lt::make_groups(kBackend, 3, "nan");
  on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
      for (lc::ReduceOp op : {lc::ReduceOp::Max, lc::ReduceOp::Min}) {
        for (int64_t n : {int64_t{8}, int64_t{1} << 20}) {
          std::vector<double> v(static_cast<size_t>(n), 1.0 + g.rank());
          if (g.rank() == 2) v.front() = v.back() = std::nan("");
          Tensor t = Tensor::from_vector<double>(v, {n}).to(dtype);
          g.allreduce(t, {.op = op, .timeout = {}})->wait();
          const std::vector<double> got = t.to(DType::f64).to_vector<double>();
          const double middle = op == lc::ReduceOp::Max ? 3.0 : 1.0;
          if (!std::isnan(got.front()) || !std::isnan(got.back()) || got[1] != middle)
            failures.push_back(fmt::format("{} {} n={}: got {}, {}, {}", dtype_name(dtype),
                                           lc::to_string(op), n, got.front(), got[1],
                                           got.back()));
        }
      }
    }
  });
}

TEST_CASE("shm: a rank that cannot map rank 0's segment is told the ranks must share a machine",
          "[shm]") {
  // As on another machine: the segment rank 0 published is not in this /dev/shm.
  lockstep::distributed::MemoryStore store;
  store.set("g/shm/1/segment", std::string("/lockstep-no-such-segment 4096 other-host"));
  const std::string error = lt::error_of([&] {
    lc::shm::join_group(store, "g/shm/1/", "g", 1, 2, std::chrono::seconds(5), 4096,
                        std::chrono::microseconds(0));
  });
  CHECK_THAT(error, Catch::Contains("rank 1 could not join") &&
                        Catch::Contains("rank 0 runs on host other-host") &&
                        Catch::Contains("must share one machine's /dev/shm") &&
                        Catch::Contains("LOCKSTEP_NODE_ID"));
  CHECK_THAT(store.get_string("g/shm/1/attached/1"), Catch::StartsWith("error "));
}
