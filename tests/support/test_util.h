// Small helpers shared by the tests: a tensor's values, element-wise and
// bitwise comparisons, gradient checks as one CHECK, and the message of the
// lockstep::Error a call throws.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/runtime/dtype.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/tensor.h"
#include "support/gradcheck.h"

namespace lockstep::testing {

// Every dtype, for tests that loop over all of them.
inline const std::vector<runtime::DType> kAllDTypes = {
    runtime::DType::f32, runtime::DType::f64, runtime::DType::bf16, runtime::DType::f16,
    runtime::DType::i32, runtime::DType::i64, runtime::DType::u8,   runtime::DType::boolean};

// The elements of t as doubles, in row-major order, whatever its layout.
inline std::vector<double> values(const Tensor& t) { return t.detach().to_vector<double>(); }

// Through double, which holds every f32 value exactly: equal means bit-identical
// (for non-NaN values). Two undefined tensors are equal.
inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  return a.shape() == b.shape() && a.dtype() == b.dtype() && values(a) == values(b);
}

// 0, 1, ..., n-1 as a tensor of `dtype` with `shape`.
inline Tensor iota(const runtime::Shape& shape, runtime::DType dtype = runtime::DType::f32) {
  return Tensor::arange(runtime::shape_numel(shape), dtype).reshape(shape);
}

// Checks t against `expected` element by element, each within `tol` both
// relative and absolute.
inline void check_close(const Tensor& t, const std::vector<double>& expected, double tol = 1e-6) {
  auto v = values(t);
  REQUIRE(v.size() == expected.size());
  for (size_t i = 0; i < v.size(); ++i) {
    INFO("element " << i);
    CHECK(v[i] == Approx(expected[i]).epsilon(tol).margin(tol));
  }
}

// gradcheck(f, inputs) with its default tolerances as one CHECK, the failure
// message led by `name`.
inline void check_grad(const char* name,
                       const std::function<Tensor(const std::vector<Tensor>&)>& f,
                       const std::vector<Tensor>& inputs) {
  auto r = gradcheck(f, inputs);
  INFO(name << ": " << r.message);
  CHECK(r.ok);
}

// The message of the lockstep::Error that fn() throws; a marker string when it
// throws nothing or something else, so CHECK_THAT(..., Contains(...)) fails
// with a readable reason.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const lockstep::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not a lockstep::Error: ") + e.what() + ">";
  }
  return "<no exception>";
}

// Polls `done` until it holds or `limit` passes (generous: a loaded CI VM).
inline bool eventually(const std::function<bool()>& done,
                       std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace lockstep::testing
