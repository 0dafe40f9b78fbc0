// The desync checker (LOCKSTEP_DEBUG=detail) over gloo, in one process.
#include <catch2/catch.hpp>

#include "lockstep/config.h"

#if LOCKSTEP_HAVE_GLOO

#include "collectives/rank_threads.h"
#include "support/test_util.h"

namespace lc = lockstep::collectives;
namespace lt = lockstep::testing;
using lockstep::distributed::DebugLevel;
using lockstep::runtime::DType;
using lockstep::runtime::Tensor;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

namespace {

auto make_checked(int size, const std::string& name, std::chrono::milliseconds timeout = 30s) {
  return lt::make_groups("gloo", size, name, timeout, DebugLevel::Detail);
}

// Every rank's error message (or "<no exception>").
std::vector<std::string> messages(const std::vector<std::exception_ptr>& errors) {
  std::vector<std::string> out;
  for (const auto& e : errors) out.push_back(lt::message_of(e));
  return out;
}

}  // namespace

TEST_CASE("desync: matching calls pass through and compute", "[collectives][gloo]") {
  const auto groups = make_checked(3, "in-step");
  std::vector<double> results(3);
  const auto errors = lt::run_ranks(3, [&](int r) {
    auto& g = *groups[static_cast<size_t>(r)];
    Tensor t = Tensor::full({5}, r, DType::f32);
    for (int k = 0; k < 6; ++k) g.allreduce(t)->wait();  // several: old keys get deleted
    Tensor b = Tensor::full({2}, r, DType::i64);
    g.broadcast(b, {.root = 2, .timeout = {}})->wait();
    g.barrier()->wait();
    results[static_cast<size_t>(r)] = lt::values(t)[0] + lt::values(b)[0];
  });
  for (const auto& m : messages(errors)) CHECK(m == "<no exception>");
  // (0 + 1 + 2) * 3^5 after six sums, plus rank 2's broadcast value.
  for (double v : results) CHECK(v == 729.0 + 2.0);
}

TEST_CASE("desync: a rank calling a different op is named with the first divergent call",
          "[collectives][gloo]") {
  const auto groups = make_checked(3, "diverge-op");
  const auto errors = lt::run_ranks(3, [&](int r) {
    auto& g = *groups[static_cast<size_t>(r)];
    g.barrier()->wait();
    Tensor t = Tensor::zeros({1000});
    if (r == 1) {
      g.broadcast(t)->wait();
    } else {
      g.allreduce(t)->wait();
    }
  });
  for (const auto& m : messages(errors)) {
    CHECK_THAT(m, Contains("collective #2 differs across ranks of group 'diverge-op'") &&
                      Contains("ranks 0 and 2 called allreduce(f32, 1000 elements, sum)") &&
                      Contains("rank 1 called broadcast(f32, 1000 elements, root 0)"));
  }
}

TEST_CASE("desync: different dtype or count is caught", "[collectives][gloo]") {
  const bool by_dtype = GENERATE(true, false);
  const auto groups = make_checked(2, "diverge-shape");
  const auto errors = lt::run_ranks(2, [&](int r) {
    auto& g = *groups[static_cast<size_t>(r)];
    Tensor t = (r == 1 && by_dtype)   ? Tensor::zeros({10}, DType::f64)
               : (r == 1 && !by_dtype) ? Tensor::zeros({11})
                                       : Tensor::zeros({10});
    g.allreduce(t, {.op = lc::ReduceOp::Max, .timeout = {}})->wait();
  });
  const std::string other = by_dtype ? "allreduce(f64, 10 elements, max)"
                                     : "allreduce(f32, 11 elements, max)";
  for (const auto& m : messages(errors)) {
    CHECK_THAT(m, Contains("collective #1 differs") &&
                      Contains("rank 0 called allreduce(f32, 10 elements, max)") &&
                      Contains("rank 1 called " + other));
  }
}

TEST_CASE("desync: a rank that never arrives is named with its last call", "[collectives][gloo]") {
  const auto groups = make_checked(2, "missing", 1500ms);
  std::string seen;
  const auto errors = lt::run_ranks(2, [&](int r) {
    auto& g = *groups[static_cast<size_t>(r)];
    g.barrier()->wait();
    if (r == 1) return;  // stops issuing collectives
    Tensor t = Tensor::zeros({4});
    seen = lt::error_of([&] { g.allreduce(t)->wait(); });
  });
  CHECK(errors[0] == nullptr);
  CHECK(errors[1] == nullptr);
  CHECK_THAT(seen, Contains("collective #2 (allreduce(f32, 4 elements, sum)) on rank 0") &&
                       Contains("rank 1 did not issue collective #2") &&
                       Contains("rank 1's last recorded call was collective #1: barrier()"));
}

TEST_CASE("desync: a rank that drops its group is named at once by the others' next call",
          "[collectives][gloo]") {
  // Rank 1 leaves its loop early and returns: its group is destroyed while
  // rank 0 goes on. Without the checker gloo tells rank 0 at once; with it,
  // rank 0 used to wait for rank 1's fingerprint for the whole timeout.
  auto groups = make_checked(2, "dropped", 15s);
  const auto errors =
      lt::run_ranks(2, [&](int r) { groups[static_cast<size_t>(r)]->barrier()->wait(); });
  REQUIRE(messages(errors) == std::vector<std::string>(2, "<no exception>"));
  groups[1].reset();
  Tensor t = Tensor::zeros({4});
  const auto start = std::chrono::steady_clock::now();
  const std::string seen = lt::error_of([&] { groups[0]->allreduce(t)->wait(); });
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  CHECK_THAT(seen, Contains("collective #2 differs across ranks of group 'dropped'") &&
                       Contains("rank 0 called allreduce(f32, 4 elements, sum)") &&
                       Contains("rank 1 called nothing more: it destroyed its group after "
                                "collective #1"));
}

#endif  // LOCKSTEP_HAVE_GLOO
