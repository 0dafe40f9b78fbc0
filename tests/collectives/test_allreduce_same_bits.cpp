// Every rank gets bitwise the same all-reduce result, on every CPU backend,
// for inputs whose float sums round (the collective_check.h inputs are small
// integers, whose sums are exact in any order, so they cannot tell). DDP's
// promise that parameters stay bitwise identical on every rank rests on this:
// a backend in which ranks summed in different orders would let the replicas
// drift apart by a rounding per step, silently.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "collectives/rank_threads.h"
#include "lockstep/collectives/hierarchical_group.h"
#include "lockstep/collectives/node_topology.h"
#include "lockstep/config.h"
#include "lockstep/distributed/store/memory_store.h"
#include "support/backend_skip.h"

namespace lc = lockstep::collectives;
namespace lt = lockstep::testing;
using lockstep::runtime::DType;
using lockstep::runtime::Tensor;
using namespace std::chrono_literals;

namespace {

// Rank r's n values: uniform in (-1, 1) times 2^k for k in [-12, 12], so that
// partial sums round and their order shows in the last bits.
Tensor rounding_input(int r, int64_t n, DType dtype) {
  std::mt19937_64 gen(static_cast<uint64_t>(1000 + r));
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = std::ldexp(unit(gen), exponent(gen));
  return Tensor::from_vector(v, {n}).to(dtype);
}

std::vector<std::byte> bytes_of(const Tensor& t) {
  std::vector<std::byte> b(static_cast<size_t>(t.numel()) * t.element_size());
  std::memcpy(b.data(), t.raw_data(), b.size());
  return b;
}

// Runs one all-reduce of rounding_input on every rank of `groups` (in a tensor
// taken from the group's shared pool when `in_pool`, which shm reduces in
// place) and returns what differs from rank 0's result, or "".
std::string first_rank_that_differs(const std::vector<std::shared_ptr<lc::ProcessGroup>>& groups,
                                    int64_t n, DType dtype, lc::ReduceOp op, bool in_pool) {
  const int size = static_cast<int>(groups.size());
  std::vector<std::vector<std::byte>> results(static_cast<size_t>(size));
  const auto errors = lt::run_ranks(size, [&](int r) {
    lc::ProcessGroup& g = *groups[static_cast<size_t>(r)];
    Tensor t = rounding_input(r, n, dtype);
    if (in_pool) {
      auto pool = g.reserve_shared_pool(static_cast<size_t>(n) * t.element_size());
      if (pool) {
        Tensor pooled = pool->empty(t.shape(), t.dtype());
        pooled.copy_(t);
        t = pooled;
      }
    }
    g.allreduce(t, {.op = op})->wait();
    results[static_cast<size_t>(r)] = bytes_of(t);
  });
  for (const auto& e : errors) {
    if (e) return lt::message_of(e);
  }
  for (int r = 1; r < size; ++r) {
    if (results[static_cast<size_t>(r)] != results[0]) {
      return fmt::format("rank {} got other bits than rank 0 (world size {}, {} elements)", r,
                         size, n);
    }
  }
  return "";
}

void check_every_rank_alike(const std::vector<std::shared_ptr<lc::ProcessGroup>>& groups,
                            const std::string& backend) {
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    for (const lc::ReduceOp op : {lc::ReduceOp::Sum, lc::ReduceOp::Avg}) {
      // One round (small), slices through staging, and in place in the pool.
      for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{1001}, int64_t{40001}}) {
        for (const bool in_pool : {false, true}) {
          INFO(backend << " " << lockstep::runtime::dtype_name(dtype) << " "
                       << (op == lc::ReduceOp::Sum ? "sum" : "avg") << " n=" << n
                       << (in_pool ? " in the shared pool" : ""));
          CHECK(first_rank_that_differs(groups, n, dtype, op, in_pool) == "");
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("every CPU backend gives every rank bitwise the same all-reduce result when sums round",
          "[collectives][determinism]") {
  const std::string backend = GENERATE(from_range(lt::cpu_backends_and_hierarchical()));
  // Two ranks' sum is the same in either order; 2 checks the other paths
  // (staging, the pool, averaging), 3 and 4 the order.
  const int size = GENERATE(2, 3, 4);
  LOCKSTEP_SKIP_UNLESS_BACKEND(backend);
  const auto groups = lt::make_groups(backend, size, fmt::format("same-bits-{}", size), 60s);
  check_every_rank_alike(groups, backend);
}

#if LOCKSTEP_HAVE_GLOO
TEST_CASE("the hierarchical group gives every rank of every node bitwise the same all-reduce "
          "result when sums round",
          "[collectives][determinism]") {
  using Keys = std::vector<std::string>;
  const Keys keys = GENERATE(Keys{"a", "a", "b"}, Keys{"a", "b", "a", "b"}, Keys{"a", "a", "b", "b"});
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  const int size = static_cast<int>(keys.size());
  std::vector<std::shared_ptr<lc::ProcessGroup>> groups(static_cast<size_t>(size));
  const auto errors = lt::run_ranks(size, [&](int r) {
    const auto topology =
        lc::discover_topology(*store, r, size, "same-bits-nodes", keys[static_cast<size_t>(r)], 60s);
    groups[static_cast<size_t>(r)] =
        lc::make_hierarchical_group(store, r, size, "same-bits-nodes", 60s, topology, "gloo");
  });
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  check_every_rank_alike(groups, "gloo+gloo");
}
#endif
