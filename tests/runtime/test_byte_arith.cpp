// Arithmetic on u8 and bool tensors as PyTorch does it: max and argmax of u8
// (and max of bool), in-place add_ and mul_ of u8 wrapping modulo 256, of
// bool as a logical or (add_) and and (mul_).
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "lockstep/runtime/ops/reduce.h"
#include "lockstep/runtime/tensor.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

namespace {

Tensor bytes_of(const std::vector<int>& values, DType dtype, const Shape& shape) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* p = static_cast<uint8_t*>(t.raw_data());
  for (size_t i = 0; i < values.size(); ++i) p[i] = static_cast<uint8_t>(values[i]);
  return t;
}
Tensor bytes_of(const std::vector<int>& values, DType dtype) {
  return bytes_of(values, dtype, {static_cast<int64_t>(values.size())});
}

std::vector<int> values_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.raw_data());
  return {p, p + c.numel()};
}

std::vector<int64_t> indices_of(const Tensor& t) { return t.contiguous().to_vector<int64_t>(); }

}  // namespace

TEST_CASE("max and argmax of u8 compare as unsigned bytes", "[runtime][ops][reduce]") {
  // 200 and 250 are past i8's range: a signed comparison would pick 3 and 7.
  Tensor flat = bytes_of({3, 200, 7, 250, 1}, DType::u8);
  Tensor m = max(flat);
  CHECK(m.dtype() == DType::u8);
  CHECK(values_of(m) == std::vector<int>{250});
  CHECK(indices_of(argmax(flat, 0)) == std::vector<int64_t>{3});

  Tensor grid = bytes_of({3, 200, 250, 1}, DType::u8, {2, 2});
  CHECK(values_of(max(grid, 0)) == std::vector<int>{250, 200});
  CHECK(indices_of(argmax(grid, 0)) == std::vector<int64_t>{1, 0});
  CHECK(indices_of(argmax(grid, 1, true)) == std::vector<int64_t>{1, 0});

  Tensor flags = bytes_of({0, 1, 0}, DType::boolean);
  CHECK(max(flags).dtype() == DType::boolean);
  CHECK(values_of(max(flags)) == std::vector<int>{1});
}

TEST_CASE("add_ and mul_ of u8 wrap around modulo 256", "[runtime][inplace]") {
  Tensor a = bytes_of({200, 3}, DType::u8);
  a.add_(bytes_of({100, 4}, DType::u8));
  CHECK(values_of(a) == std::vector<int>{44, 7});
  a.add_(bytes_of({100, 4}, DType::u8), 3);  // 44 + 300, 7 + 12
  CHECK(values_of(a) == std::vector<int>{88, 19});
  a.mul_(bytes_of({3, 2}, DType::u8));
  CHECK(values_of(a) == std::vector<int>{8, 38});
  a.mul_(16);
  CHECK(values_of(a) == std::vector<int>{128, 96});
  // A bool or wider integer operand is read as a u8, as PyTorch's casts it.
  a.add_(bytes_of({1, 0}, DType::boolean));
  CHECK(values_of(a) == std::vector<int>{129, 96});
  a.add_(Tensor::full({2}, 300, DType::i64));  // 300 = 44 modulo 256
  CHECK(values_of(a) == std::vector<int>{173, 140});
  CHECK_THAT(error_of([&] { a.add_(Tensor::ones({2})); }), Contains("f32") && Contains("u8"));
}

TEST_CASE("add_ of bool is a logical or and mul_ a logical and", "[runtime][inplace]") {
  Tensor t = bytes_of({1, 0, 0}, DType::boolean);
  t.add_(bytes_of({1, 1, 0}, DType::boolean));
  CHECK(values_of(t) == std::vector<int>{1, 1, 0});
  t.mul_(bytes_of({1, 0, 1}, DType::boolean));
  CHECK(values_of(t) == std::vector<int>{1, 0, 0});
  t.add_(bytes_of({0, 1, 1}, DType::boolean), 2);  // a nonzero alpha is true
  CHECK(values_of(t) == std::vector<int>{1, 1, 1});
  t.mul_(0);
  CHECK(values_of(t) == std::vector<int>{0, 0, 0});
  // As PyTorch: a u8 result cannot be written into a bool tensor.
  CHECK_THAT(error_of([&] { t.add_(bytes_of({1, 1, 1}, DType::u8)); }),
             Contains("add_") && Contains("u8") && Contains("bool"));
  CHECK_THAT(error_of([&] { t.mul_(2); }), Contains("mul_") && Contains("bool"));
}
