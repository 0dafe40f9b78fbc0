// Sum, Avg and Product of i32 and i64 whose results leave the dtype's range
// wrap around in two's complement on the CPU backends, as NCCL's and gloo's
// do (a signed overflow in the reduction was undefined behaviour: a
// -fsanitize=undefined build stopped there).
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
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

// Rank r's element i: the dtype's extremes and values near them.
template <class T>
T value_of(int r, int64_t i) {
  const T values[] = {std::numeric_limits<T>::max(), std::numeric_limits<T>::min(), T{-3},
                      static_cast<T>(std::numeric_limits<T>::max() / 2 + 7), T{2}};
  return values[(static_cast<size_t>(r) * 2 + static_cast<size_t>(i)) % 5];
}

// The reduction over `size` ranks in unsigned (wrapping) arithmetic.
template <class T>
T expected(lc::ReduceOp op, int size, int64_t i) {
  using U = std::make_unsigned_t<T>;
  U sum = 0, product = 1;
  for (int r = 0; r < size; ++r) {
    sum += static_cast<U>(value_of<T>(r, i));
    product *= static_cast<U>(value_of<T>(r, i));
  }
  if (op == lc::ReduceOp::Product) return static_cast<T>(product);
  if (op == lc::ReduceOp::Sum) return static_cast<T>(sum);
  return static_cast<T>(static_cast<T>(sum) / size);  // Avg: truncates toward zero
}

template <class T>
void check_wraps(const std::string& backend, int size) {
  constexpr DType dtype = std::is_same_v<T, int32_t> ? DType::i32 : DType::i64;
  const int64_t n = 10;
  const auto groups = lt::make_groups(backend, size, "integer-wrap");
  lt::on_every_rank(groups, [&](lc::ProcessGroup& g, std::vector<std::string>& failures) {
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = value_of<T>(g.rank(), i);
    for (lc::ReduceOp op : {lc::ReduceOp::Sum, lc::ReduceOp::Avg, lc::ReduceOp::Product}) {
      Tensor t = Tensor::from_vector<int64_t>(v, {n}).to(dtype);
      g.allreduce(t, {.op = op, .timeout = {}})->wait();
      const auto got = t.to(DType::i64).to_vector<int64_t>();
      for (int64_t i = 0; i < n; ++i) {
        const auto want = static_cast<int64_t>(expected<T>(op, size, i));
        if (got[static_cast<size_t>(i)] != want) {
          failures.push_back(fmt::format("{} {}: element {} is {}, expected {}",
                                         dtype_name(dtype), lc::to_string(op), i,
                                         got[static_cast<size_t>(i)], want));
          break;
        }
      }
    }
  });
}

}  // namespace

TEST_CASE("shm: integer Sum, Avg and Product wrap around", "[collectives][shm]") {
  const int size = GENERATE(2, 3);
  check_wraps<int32_t>("shm", size);
  check_wraps<int64_t>("shm", size);
}

#if LOCKSTEP_HAVE_GLOO
TEST_CASE("gloo: integer Sum, Avg and Product wrap around", "[collectives][gloo]") {
  const int size = GENERATE(2, 3);
  check_wraps<int32_t>("gloo", size);
  check_wraps<int64_t>("gloo", size);
}
#endif
