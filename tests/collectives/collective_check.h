// What the in-process collective tests share: the dtypes, reduce ops and
// counts they loop over, the inputs each rank contributes, the exact results
// expected of them, and running one body on every rank of a set of groups.
//
// Inputs are small integers, so every sum, product, min and max over up to 4
// ranks is exact in every dtype, bf16 and f16 included, and so is an average
// over 2 or 4 ranks; an average over 3 ranks is the exact quotient rounded to
// the dtype (what dividing the exact sum by the group size gives). Expected
// values are computed here in int64 independently of the backend.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "collectives/rank_threads.h"
#include "lockstep/collectives/process_group.h"
#include "lockstep/runtime/dtype.h"
#include "lockstep/runtime/half.h"
#include "lockstep/runtime/tensor.h"
#include "support/test_util.h"

namespace lockstep::testing {

inline const std::vector<runtime::DType> kDTypes = {runtime::DType::f32,  runtime::DType::f64,
                                                    runtime::DType::bf16, runtime::DType::f16,
                                                    runtime::DType::i32,  runtime::DType::i64};
inline const std::vector<collectives::ReduceOp> kOps = {
    collectives::ReduceOp::Sum, collectives::ReduceOp::Avg, collectives::ReduceOp::Min,
    collectives::ReduceOp::Max, collectives::ReduceOp::Product};
inline const std::vector<int64_t> kCounts = {0, 1, 7, 1001};

// Rank r's element i: in [-3, 3], different across ranks and positions.
inline int64_t input_value(int r, int64_t i) { return (r * 3 + i * 7 + i / 5) % 7 - 3; }

// Rank r's input of n elements (elements offset .. offset + n - 1).
inline runtime::Tensor input(int r, int64_t n, runtime::DType dtype, int64_t offset = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    v[static_cast<size_t>(i)] = static_cast<double>(input_value(r, i + offset));
  }
  return runtime::Tensor::from_vector(v, {n}).to(dtype);
}

// x rounded to the nearest value of floating `dtype` (through float for bf16
// and f16, which is the same for the quotients used here).
inline double round_to(runtime::DType dtype, double x) {
  return runtime::dispatch_all(dtype, [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_same_v<T, runtime::bf16> || std::is_same_v<T, runtime::f16>) {
      return static_cast<double>(static_cast<float>(T(static_cast<float>(x))));
    } else {
      return static_cast<double>(static_cast<T>(x));
    }
  });
}

// The reduction by `op` over ranks 0 .. size-1 of input_value(r, i), as
// `dtype` holds it.
inline double expected_value(collectives::ReduceOp op, runtime::DType dtype, int size, int64_t i) {
  int64_t sum = 0, product = 1, lo = input_value(0, i), hi = lo;
  for (int r = 0; r < size; ++r) {
    const int64_t v = input_value(r, i);
    sum += v;
    product *= v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  switch (op) {
    case collectives::ReduceOp::Sum: return static_cast<double>(sum);
    case collectives::ReduceOp::Product: return static_cast<double>(product);
    case collectives::ReduceOp::Min: return static_cast<double>(lo);
    case collectives::ReduceOp::Max: return static_cast<double>(hi);
    case collectives::ReduceOp::Avg:
      return runtime::is_floating(dtype)
                 ? round_to(dtype, static_cast<double>(sum) / size)
                 : static_cast<double>(sum / size);  // truncates toward zero
  }
  return NAN;
}

// First mismatch of `t` against `expected(i)`, or "" when all match.
inline std::string mismatch(const runtime::Tensor& t, const std::function<double(int64_t)>& expected,
                            const std::string& what) {
  const auto v = values(t);
  for (size_t i = 0; i < v.size(); ++i) {
    const double e = expected(static_cast<int64_t>(i));
    if (v[i] != e) return fmt::format("{}: element {} is {}, expected {}", what, i, v[i], e);
  }
  return "";
}

inline void add_failure(std::vector<std::string>& failures, std::string text) {
  if (!text.empty()) failures.push_back(std::move(text));
}

// Runs fn(group, failures) on every rank, one thread each; checks that no
// rank threw or recorded a failure.
inline void on_every_rank(
    const std::vector<std::shared_ptr<collectives::ProcessGroup>>& groups,
    const std::function<void(collectives::ProcessGroup&, std::vector<std::string>&)>& fn) {
  const int size = static_cast<int>(groups.size());
  std::vector<std::vector<std::string>> failures(static_cast<size_t>(size));
  const auto errors = run_ranks(size, [&](int r) {
    fn(*groups[static_cast<size_t>(r)], failures[static_cast<size_t>(r)]);
  });
  for (int r = 0; r < size; ++r) {
    INFO("rank " << r);
    CHECK(message_of(errors[static_cast<size_t>(r)]) == "<no exception>");
    const auto& f = failures[static_cast<size_t>(r)];
    INFO((f.empty() ? std::string() : f.front()));
    CHECK(f.size() == 0);
  }
}

}  // namespace lockstep::testing
