// Avg of bf16 and f16 on the CPU backends: the mean comes out wherever the
// dtype holds it, even where the ranks' sum does not (f16 tops out at 65504),
// and it is the float mean rounded once.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <fmt/format.h>

#include "collectives/collective_check.h"
#include "collectives/rank_threads.h"
#include "lockstep/collectives/hierarchical_group.h"
#include "lockstep/collectives/node_topology.h"
#include "lockstep/config.h"
#include "support/test_util.h"

namespace lc = lockstep::collectives;
namespace lt = lockstep::testing;
using lockstep::runtime::DType;
using lockstep::runtime::Tensor;
using namespace std::chrono_literals;

namespace {

// Rank r's i-th value: large enough that two ranks' sum leaves f16's range.
double value_of(int r, int64_t i) { return 40000.0 + 1000.0 * r + 8.0 * (i % 5); }

double mean_of(DType dtype, int size, int64_t i) {
  double sum = 0;
  for (int r = 0; r < size; ++r) sum += lt::round_to(dtype, value_of(r, i));
  return lt::round_to(dtype, sum / size);
}

Tensor values(int r, int64_t n, DType dtype, int64_t offset = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = value_of(r, i + offset);
  return Tensor::from_vector(v, {n}).to(dtype);
}

void check_averages(const std::vector<std::shared_ptr<lc::ProcessGroup>>& groups) {
  const int size = static_cast<int>(groups.size());
  lt::on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    const int r = g.rank();
    for (DType dtype : {DType::f16, DType::bf16}) {
      const auto d = lockstep::runtime::dtype_name(dtype);
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1001}}) {
        const auto mean = [&](int64_t i) { return mean_of(dtype, size, i); };
        Tensor t = values(r, n, dtype);
        g.allreduce(t, {.op = lc::ReduceOp::Avg, .timeout = {}})->wait();
        lt::add_failure(failures, lt::mismatch(t, mean, fmt::format("allreduce {} n={}", d, n)));

        Tensor rt = values(r, n, dtype);
        g.reduce(rt, {.op = lc::ReduceOp::Avg, .root = size - 1, .timeout = {}})->wait();
        if (r == size - 1) {
          lt::add_failure(failures, lt::mismatch(rt, mean, fmt::format("reduce {} n={}", d, n)));
        }

        Tensor in = values(r, n * size, dtype);
        Tensor out = Tensor::zeros({n}, dtype);
        g.reduce_scatter(out, in, {.op = lc::ReduceOp::Avg, .timeout = {}})->wait();
        lt::add_failure(failures, lt::mismatch(out, [&](int64_t i) {
                          return mean_of(dtype, size, r * n + i);
                        }, fmt::format("reduce_scatter {} n={}", d, n)));
      }
    }
  });
}

}  // namespace

TEST_CASE("shm: Avg of f16 and bf16 gives the mean where the ranks' sum overflows",
          "[collectives][shm]") {
  const int size = GENERATE(2, 3);
  check_averages(lt::make_groups("shm", size, "float-average"));
}

#if LOCKSTEP_HAVE_GLOO
TEST_CASE("gloo: Avg of f16 and bf16 gives the mean where the ranks' sum overflows",
          "[collectives][gloo]") {
  const int size = GENERATE(2, 3);
  check_averages(lt::make_groups("gloo", size, "float-average"));
}

TEST_CASE("shm+gloo: Avg of f16 and bf16 gives the mean where the ranks' sum overflows",
          "[collectives][hierarchical]") {
  const std::vector<std::string> keys = {"a", "a", "b"};
  auto store = std::make_shared<lockstep::distributed::MemoryStore>();
  std::vector<std::shared_ptr<lc::ProcessGroup>> groups(keys.size());
  const auto errors = lt::run_ranks(3, [&](int r) {
    const auto topology = lc::discover_topology(*store, r, 3, "float-average",
                                                keys[static_cast<size_t>(r)], 60s);
    groups[static_cast<size_t>(r)] = lc::make_hierarchical_group(
        store, r, 3, "float-average", 60s, topology, "shm");
  });
  for (const auto& e : errors) REQUIRE(lt::message_of(e) == "<no exception>");
  check_averages(groups);
}
#endif
