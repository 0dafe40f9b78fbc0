// Max and Min of -0 and +0 on the CPU backends: +0 is the larger zero, so the
// result's sign does not depend on which rank holds which zero, on the
// backend, or on where the element lies (the slice a rank reduces).
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "collectives/collective_check.h"
#include "collectives/rank_threads.h"
#include "lockstep/config.h"

namespace lc = lockstep::collectives;
namespace lt = lockstep::testing;
using lockstep::runtime::DType;
using lockstep::runtime::Tensor;

namespace {

// Element i of rank r: -0 or +0, each zero held by some rank at every index,
// in an order that changes along the tensor.
double zero_of(int r, int64_t i) { return (r + i / 3) % 2 == 0 ? -0.0 : 0.0; }

std::string sign_mismatch(const Tensor& t, bool want_negative, const std::string& what) {
  const auto v = t.to(DType::f64).to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != 0.0 || std::signbit(v[i]) != want_negative) {
      return fmt::format("{}: element {} is {}, expected {}", what, i, v[i],
                         want_negative ? "-0" : "+0");
    }
  }
  return "";
}

void check_zeros(const std::string& backend, int size) {
  const auto groups = lt::make_groups(backend, size, "signed-zero");
  lt::on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    const int r = g.rank();
    for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
      // The one-round path and the sliced one (over 32 KiB).
      for (int64_t n : {int64_t{12}, int64_t{12000}}) {
        std::vector<double> v(static_cast<size_t>(n * size));
        for (int64_t i = 0; i < n * size; ++i) v[static_cast<size_t>(i)] = zero_of(r, i);
        for (lc::ReduceOp op : {lc::ReduceOp::Max, lc::ReduceOp::Min}) {
          const bool negative = op == lc::ReduceOp::Min;
          const auto what = [&](const char* call) {
            return fmt::format("{} {} {} n={}", call, lc::to_string(op), dtype_name(dtype), n);
          };
          Tensor t = Tensor::from_vector<double>(v, {n * size}).to(dtype);
          g.allreduce(t, {.op = op, .timeout = {}})->wait();
          lt::add_failure(failures, sign_mismatch(t, negative, what("allreduce")));

          Tensor rt = Tensor::from_vector<double>(v, {n * size}).to(dtype);
          g.reduce(rt, {.op = op, .root = size - 1, .timeout = {}})->wait();
          if (r == size - 1) lt::add_failure(failures, sign_mismatch(rt, negative, what("reduce")));

          Tensor in = Tensor::from_vector<double>(v, {n * size}).to(dtype);
          Tensor out = Tensor::ones({n}, dtype);
          g.reduce_scatter(out, in, {.op = op, .timeout = {}})->wait();
          lt::add_failure(failures, sign_mismatch(out, negative, what("reduce_scatter")));
        }
      }
    }
  });
}

}  // namespace

TEST_CASE("shm Max and Min: +0 is larger than -0 whichever rank holds it", "[collectives][shm]") {
  check_zeros("shm", GENERATE(2, 3));
}

#if LOCKSTEP_HAVE_GLOO
TEST_CASE("gloo Max and Min: +0 is larger than -0 whichever rank holds it",
          "[collectives][gloo]") {
  check_zeros("gloo", GENERATE(2, 3));
}
#endif
