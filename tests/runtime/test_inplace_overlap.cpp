// In-place writes whose result would depend on the order of the writes are
// refused, as PyTorch refuses them: a source sharing part of the memory of
// the tensor written to, and a written-to tensor with several elements at one
// memory location (expanded). Also the dims of a 0-d tensor, negative expand
// sizes and a .grad of another dtype: each used to crash or give a wrong
// answer without a word. So did a source that requires grad (its gradient was
// lost) and an integer tensor written with a fractional value (truncated).
#include <catch2/catch.hpp>

#include <vector>

#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/tensor.h"

using namespace lockstep::runtime;
using Catch::Matchers::Contains;

namespace {
Tensor arange_f32(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i);
  return Tensor::from_vector<float>(v, {n});
}
}  // namespace

TEST_CASE("in-place ops refuse a source that overlaps the tensor written to in part") {
  Tensor x = arange_f32(6);
  CHECK_THROWS_WITH(x.slice(0, 1, 6).add_(x.slice(0, 0, 5)), Contains("share part of their memory"));
  CHECK_THROWS_WITH(x.slice(0, 1, 6).copy_(x.slice(0, 0, 5)), Contains("copy_: the source"));
  Tensor a = arange_f32(9).view({3, 3});
  CHECK_THROWS_WITH(a.copy_(a.t()), Contains("share part of their memory"));
  CHECK_THROWS_WITH(a.add_(a.t()), Contains("share part of their memory"));
  CHECK_THROWS_WITH(a.mul_(a.select(0, 0)), Contains("share part of their memory"));
  // Nothing was written.
  CHECK(x.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5});
  // The same layout, or disjoint parts, are fine.
  x.add_(x);
  CHECK(x.to_vector<float>() == std::vector<float>{0, 2, 4, 6, 8, 10});
  x.copy_(x);
  x.slice(0, 3, 6).copy_(x.slice(0, 0, 3));
  CHECK(x.to_vector<float>() == std::vector<float>{0, 2, 4, 0, 2, 4});
}

TEST_CASE("in-place ops refuse a strided source that shares elements with the tensor written to") {
  // x[:, 1:].copy_(x[:, :-1]) ran memcpy over overlapping rows (undefined) and
  // add_ gave a running sum along each row: neither view is dense, and only
  // dense views were compared.
  Tensor x = arange_f32(10).view({2, 5});
  CHECK_THROWS_WITH(x.slice(1, 1, 5).copy_(x.slice(1, 0, 4)),
                    Contains("share part of their memory"));
  CHECK_THROWS_WITH(x.slice(1, 1, 5).add_(x.slice(1, 0, 4)),
                    Contains("share part of their memory"));
  CHECK_THROWS_WITH(x.slice(1, 0, 2).mul_(x.slice(1, 1, 3)),
                    Contains("share part of their memory"));
  // Subtracting the first column from each row zeroed that column first, so
  // the rest of each row subtracted 0.
  CHECK_THROWS_WITH(x.add_(x.slice(1, 0, 1), -1.0), Contains("share part of their memory"));
  Tensor sq = arange_f32(12).view({3, 4}).slice(1, 0, 3);
  CHECK_THROWS_WITH(sq.copy_(sq.t()), Contains("share part of their memory"));
  CHECK(x.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  // Views whose rows interleave but share no element are fine: the two halves
  // of each row, or every other column.
  Tensor y = arange_f32(8).view({2, 4});
  y.slice(1, 0, 2).copy_(y.slice(1, 2, 4));
  CHECK(y.to_vector<float>() == std::vector<float>{2, 3, 2, 3, 6, 7, 6, 7});
  y.slice(1, 0, 4, 2).add_(y.slice(1, 1, 4, 2));
  CHECK(y.to_vector<float>() == std::vector<float>{5, 3, 5, 3, 13, 7, 13, 7});
}

TEST_CASE("in-place ops refuse to write an expanded tensor") {
  Tensor base = Tensor::ones({1});
  Tensor e = base.expand({3});
  CHECK_THROWS_WITH(e.add_(arange_f32(3)), Contains("several elements at one memory location"));
  CHECK_THROWS_WITH(e.copy_(arange_f32(3)), Contains("expanded tensor"));
  CHECK_THROWS_WITH(e.fill_(2.0), Contains("expanded tensor"));
  CHECK(base.item() == 1.0);
}

TEST_CASE("dims of a 0-d tensor: an error, or the tensor itself, never a crash") {
  const Tensor s = Tensor::scalar(3.0);
  CHECK_THROWS_WITH(s.size(0), Contains("0-d tensor"));
  CHECK_THROWS_WITH(s.select(0, 0), Contains("0-d tensor"));
  CHECK_THROWS_WITH(s.slice(0, 0, 1), Contains("0-d tensor"));
  CHECK(s.squeeze(0).dim() == 0);
  CHECK(s.transpose(0, -1).item() == 3.0);
  CHECK_THROWS_WITH(s.transpose(0, 1), Contains("out of range"));
}

TEST_CASE("expand refuses negative sizes, and .grad another dtype") {
  CHECK_THROWS_WITH(Tensor::ones({1}).expand({-5}), Contains("cannot expand"));
  Tensor w = Tensor::ones({2}).requires_grad_();
  CHECK_THROWS_WITH(w.set_grad(Tensor::zeros({2}, DType::f64)), Contains("dtype f64"));
}

TEST_CASE("in-place ops refuse a source that requires grad while grad mode is on") {
  // b.add_(w) recorded nothing, so w silently lost this path's gradient.
  Tensor w = Tensor::ones({3}).requires_grad_();
  Tensor b = Tensor::zeros({3});
  CHECK_THROWS_WITH(b.add_(w), Contains("requires grad"));
  CHECK_THROWS_WITH(b.mul_(w), Contains("requires grad"));
  CHECK_THROWS_WITH(b.copy_(w), Contains("requires grad"));
  CHECK(b.to_vector<float>() == std::vector<float>{0, 0, 0});
  b.add_(w.detach());
  {
    NoGradGuard no_grad;
    b.add_(w);
  }
  CHECK(b.to_vector<float>() == std::vector<float>{2, 2, 2});
}

TEST_CASE("integer in-place ops refuse what they could only truncate") {
  Tensor i = Tensor::from_vector<int64_t>({3, 4}, {2});
  // i.mul_(0.5) gave {1, 2}; i.add_(f, 0.5) and i.add_(a float tensor) truncated too.
  CHECK_THROWS_WITH(i.mul_(0.5), Contains("0.5 is not a whole number"));
  CHECK_THROWS_WITH(i.add_(Tensor::ones({2}, DType::i64), 0.5), Contains("not a whole number"));
  CHECK_THROWS_WITH(i.add_(Tensor::ones({2})), Contains("f32 operand"));
  CHECK_THROWS_WITH(i.mul_(Tensor::ones({2}, DType::f64)), Contains("f64 operand"));
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{3, 4});
  i.mul_(2.0).add_(Tensor::ones({2}, DType::i32), 3.0);
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{9, 11});
  Tensor f = Tensor::ones({2});
  f.add_(Tensor::ones({2}, DType::f64), 0.5).mul_(0.5);
  CHECK(f.to_vector<float>() == std::vector<float>{0.75f, 0.75f});
}

TEST_CASE("i64 in-place ops refuse an alpha or factor outside i64's range") {
  Tensor i = Tensor::from_vector<int64_t>({1, 2}, {2});
  // add_ gave INT64_MIN for an alpha of 1e30; mul_(1e30) blamed a fill_ the caller never made.
  CHECK_THROWS_WITH(i.add_(Tensor::ones({2}, DType::i64), 1e30),
                    Contains("add_: 1e+30 is out of range for a i64 tensor"));
  CHECK_THROWS_WITH(i.mul_(-1e19), Contains("mul_: -1e+19 is out of range for a i64 tensor"));
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{1, 2});
  i.add_(Tensor::ones({2}, DType::i64), 4e18);
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{4000000000000000001, 4000000000000000002});
}
