// Reductions: sum, mean, max, argmax over dims, with keepdim; ties; dtypes;
// gradient checks.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/reduce.h"
#include "lockstep/runtime/random.h"
#include "lockstep/runtime/tensor.h"
#include "support/gradcheck.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

TEST_CASE("sum over all elements and over dims", "[runtime][ops][reduce]") {
  const DType dt = GENERATE(DType::f32, DType::f64);
  // t[i][j][k] = 12 i + 4 j + k
  Tensor t = iota({2, 3, 4}, dt);
  Tensor all = sum(t);
  CHECK(all.shape().empty());
  CHECK(all.dtype() == dt);
  CHECK(all.item() == 276);

  Tensor s0 = sum(t, {0});
  CHECK(s0.shape() == Shape{3, 4});
  check_close(s0, {12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34});
  Tensor s2 = sum(t, {-1});
  CHECK(s2.shape() == Shape{2, 3});
  check_close(s2, {6, 22, 38, 54, 70, 86});
  Tensor s02 = sum(t, {0, 2});
  CHECK(s02.shape() == Shape{3});
  check_close(s02, {60, 92, 124});
  Tensor s02k = sum(t, {2, 0}, /*keepdim=*/true);  // order does not matter
  CHECK(s02k.shape() == Shape{1, 3, 1});
  check_close(s02k, {60, 92, 124});
  CHECK(sum(t, {0, 1, 2}).shape().empty());
  CHECK(sum(t, {0, 1, 2}, true).shape() == Shape{1, 1, 1});
  CHECK_THROWS_WITH(sum(t, {3}), Contains("out of range"));
}

TEST_CASE("mean over all elements and over dims", "[runtime][ops][reduce]") {
  const DType dt = GENERATE(DType::f32, DType::f64);
  Tensor t = iota({2, 3, 4}, dt);
  CHECK(mean(t).item() == Approx(11.5));
  CHECK(mean(t).dtype() == dt);
  Tensor m1 = mean(t, {1}, true);
  CHECK(m1.shape() == Shape{2, 1, 4});
  check_close(m1, {4, 5, 6, 7, 16, 17, 18, 19});
  check_close(mean(t, {0, 2}), {7.5, 11.5, 15.5});
  check_close(mean(t, {-1, -2}), {5.5, 17.5});
  CHECK_THROWS_WITH(mean(Tensor::ones({2}, DType::i64)), Contains("mean") && Contains("i64"));
}

TEST_CASE("mean of bf16 and f16 scales before its one rounding", "[runtime][ops][reduce]") {
  // Rounding the sum to 16 bits first overflowed f16 past 65504 and lost bits.
  CHECK(mean(Tensor::ones({70000}, DType::f16)).item() == 1.0);
  CHECK(mean(Tensor::ones({257}, DType::bf16)).item() == 1.0);
  CHECK(mean(Tensor::ones({2049}, DType::f16)).item() == 1.0);
  Tensor halves = Tensor::ones({3, 100000}, DType::f16).mul_(0.5);
  CHECK(mean(halves, {1}).to_vector<float>() == std::vector<float>{0.5f, 0.5f, 0.5f});
}

TEST_CASE("sum of other dtypes and of views", "[runtime][ops][reduce]") {
  Tensor i = iota({3, 2}, DType::i32);
  CHECK(sum(i).dtype() == DType::i64);
  CHECK(sum(i).item() == 15);
  check_close(sum(i, {0}), {6, 9});
  Tensor b = Tensor::from_vector<bool>({true, false, true, true}, {4});
  CHECK(sum(b).item() == 3);
  CHECK(sum(b).dtype() == DType::i64);
  Tensor h = Tensor::full({4}, 0.5, DType::bf16);
  CHECK(sum(h).dtype() == DType::bf16);
  CHECK(sum(h).item() == 2.0);
  CHECK(sum(Tensor::full({3}, 0.25, DType::f16)).item() == 0.75);

  // Non-contiguous inputs: transposed, stepped, expanded.
  Tensor m = iota({3, 4}, DType::f64);
  check_close(sum(m.t(), {1}), {12, 15, 18, 21});
  check_close(sum(m.t(), {0}), {6, 22, 38});
  check_close(sum(m.slice(1, 0, 4, 2), {1}), {2, 10, 18});
  check_close(sum(Tensor::scalar(2.0, DType::f64).expand({5, 3}), {0}), {10, 10, 10});
  // Empty reductions give zero.
  CHECK(sum(Tensor::zeros({0, 3})).item() == 0);
  check_close(sum(Tensor::zeros({0, 3}), {0}), {0, 0, 0});
  // Float sums accumulate in double: 1e8 + many ones is not lost in f32.
  Tensor f = Tensor::ones({1001});
  f.select(0, 0).fill_(1e8);
  CHECK(sum(f).item() == 1e8 + 1000);
}

TEST_CASE("sum and mean of a 0-dim tensor", "[runtime][ops][reduce]") {
  Tensor s = Tensor::scalar(3.0, DType::f64);
  CHECK(sum(s).item() == 3.0);
  CHECK(sum(s, {0}).item() == 3.0);
  CHECK(sum(s, {-1}, true).shape().empty());
  CHECK(mean(s, {0}).item() == 3.0);
  CHECK_THROWS_WITH(sum(s, {1}), Contains("out of range"));
}

TEST_CASE("sum and mean refuse a dim named twice, as PyTorch", "[runtime][ops][reduce]") {
  // Before, sum(t, {1, -1}) of a 2-d tensor reduced dim 1 once and said nothing.
  const Tensor t = Tensor::ones({2, 3});
  CHECK_THROWS_WITH(sum(t, {1, -1}),
                    Contains("sum: dim 1 appears more than once in dims [1, -1] of a 2-d tensor"));
  CHECK_THROWS_WITH(mean(t, {0, 0}), Contains("mean: dim 0 appears more than once"));
  CHECK_THROWS_WITH(sum(Tensor::scalar(1.0), {0, -1}), Contains("dim 0 appears more than once"));
  CHECK(sum(t, {1, 0}).item() == 6.0);
}

TEST_CASE("max and argmax along a dim, ties go to the first index", "[runtime][ops][reduce]") {
  const DType dt = GENERATE(DType::f32, DType::f64, DType::i32, DType::i64);
  Tensor t = Tensor::from_vector<double>({3, 1, 3, 2,   //
                                          0, 5, 5, 1,   //
                                          7, 7, 7, 7},  //
                                         {3, 4})
                 .to(dt);
  Tensor m1 = max(t, 1);
  CHECK(m1.shape() == Shape{3});
  CHECK(m1.dtype() == dt);
  CHECK(values(m1) == std::vector<double>{3, 5, 7});
  Tensor a1 = argmax(t, 1);
  CHECK(a1.dtype() == DType::i64);
  CHECK(values(a1) == std::vector<double>{0, 1, 0});  // first of the ties
  CHECK(values(argmax(t, -1, true)) == std::vector<double>{0, 1, 0});
  CHECK(argmax(t, -1, true).shape() == Shape{3, 1});

  Tensor m0 = max(t, 0, /*keepdim=*/true);
  CHECK(m0.shape() == Shape{1, 4});
  CHECK(values(m0) == std::vector<double>{7, 7, 7, 7});
  CHECK(values(argmax(t, 0)) == std::vector<double>{2, 2, 2, 2});
  CHECK(max(t).item() == 7);
  CHECK(max(t).shape().empty());

  // On a transposed view.
  CHECK(values(max(t.t(), 0)) == std::vector<double>{3, 5, 7});
  CHECK(values(argmax(t.t(), 1)) == std::vector<double>{2, 2, 2, 2});
}

TEST_CASE("max over a middle dim of a 3-D tensor", "[runtime][ops][reduce]") {
  // t[i][j][k] = (j * 7 + k * 3 + i) % 5
  std::vector<double> v;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) v.push_back((j * 7 + k * 3 + i) % 5);
  Tensor t = Tensor::from_vector<double>(v, {2, 3, 4});
  std::vector<double> mx, am;
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 4; ++k) {
      int best = 0;
      for (int j = 1; j < 3; ++j)
        if (v[i * 12 + j * 4 + k] > v[i * 12 + best * 4 + k]) best = j;
      mx.push_back(v[i * 12 + best * 4 + k]);
      am.push_back(best);
    }
  CHECK(values(max(t, 1)) == mx);
  CHECK(values(argmax(t, 1)) == am);
  CHECK(max(t, 1, true).shape() == Shape{2, 1, 4});
}

TEST_CASE("max: NaN wins; empty dims are an error", "[runtime][ops][reduce]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor t = Tensor::from_vector<double>({1, nan, 3}, {3});
  CHECK(std::isnan(max(t).item()));
  CHECK(argmax(t, 0).item() == 1);
  CHECK_THROWS_WITH(max(Tensor::zeros({2, 0}), 1), Contains("empty"));
  CHECK_THROWS_WITH(argmax(Tensor::zeros({2, 3}), 2), Contains("out of range"));
}

TEST_CASE("max over a dim sends the gradient to the first maximal element; max over all "
          "elements shares it among the ties, as PyTorch",
          "[runtime][ops][reduce]") {
  Tensor t = Tensor::from_vector<double>({3, 1, 3, 0, 5, 5}, {2, 3});
  t.requires_grad_();
  max(t, 1).backward(Tensor::from_vector<double>({10, 20}, {2}));
  CHECK(values(t.grad()) == std::vector<double>{10, 0, 0, 0, 20, 0});
  t.set_grad(Tensor());
  max(t, 0, true).backward(Tensor::from_vector<double>({1, 2, 3}, {1, 3}));
  CHECK(values(t.grad()) == std::vector<double>{1, 0, 0, 0, 2, 3});
  t.set_grad(Tensor());
  max(t).backward();
  CHECK(values(t.grad()) == std::vector<double>{0, 0, 0, 0, 0.5, 0.5});
  // A NaN is the maximum: the NaNs share the gradient.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor n = Tensor::from_vector<double>({1, nan, 3, nan}, {4});
  n.requires_grad_();
  max(n).backward(Tensor::full({}, 4.0, DType::f64));
  CHECK(values(n.grad()) == std::vector<double>{0, 2, 0, 2});
}

TEST_CASE("reduction gradients match finite differences", "[runtime][ops][reduce][gradcheck]") {
  Tensor x = random_input({2, 3, 4}, 1);
  Tensor s = random_input({}, 2);
  Tensor xt = random_input({4, 3}, 3);
  check_grad("sum", [](auto& in) { return sum(in[0]); }, {x});
  check_grad("sum dim 1", [](auto& in) { return sum(in[0], {1}); }, {x});
  check_grad("sum dims 0,2 keepdim", [](auto& in) { return sum(in[0], {0, 2}, true); }, {x});
  check_grad("sum dims -1,0", [](auto& in) { return sum(in[0], {-1, 0}); }, {x});
  check_grad("sum of a 0-dim tensor", [](auto& in) { return sum(in[0], {0}); }, {s});
  check_grad("mean", [](auto& in) { return mean(in[0]); }, {x});
  check_grad("mean dims 1,2", [](auto& in) { return mean(in[0], {1, 2}); }, {x});
  check_grad("mean dim 0 keepdim", [](auto& in) { return mean(in[0], {0}, true); }, {x});
  check_grad("max dim 1", [](auto& in) { return max(in[0], 1); }, {x});
  check_grad("max dim 2 keepdim", [](auto& in) { return max(in[0], 2, true); }, {x});
  check_grad("max dim 0", [](auto& in) { return max(in[0], 0); }, {x});
  check_grad("max all", [](auto& in) { return max(in[0]); }, {x});
  check_grad("sum of transposed", [](auto& in) { return sum(in[0].t(), {1}); }, {xt});
  check_grad("max of transposed", [](auto& in) { return max(in[0].t(), 0, true); }, {xt});
  check_grad("mean then broadcast",
             [](auto& in) { return mul(in[0], mean(in[0], {2}, true)); }, {x});
}

TEST_CASE("sum and max over random dims of random layouts match a naive loop",
          "[runtime][ops][reduce]") {
  Generator g(23);
  auto pick = [&](int64_t n) { return static_cast<int64_t>(g.next_u32() % static_cast<uint32_t>(n)); };
  for (int trial = 0; trial < 200; ++trial) {
    Shape shape;
    const int64_t nd = 1 + pick(4);
    for (int64_t d = 0; d < nd; ++d) shape.push_back(1 + pick(4));
    // The same logical tensor laid out as a permuted, possibly sliced view.
    std::vector<int64_t> perm(nd);
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = nd - 1; i > 0; --i) std::swap(perm[i], perm[pick(i + 1)]);
    Shape stored(nd);
    for (int64_t i = 0; i < nd; ++i) stored[perm[i]] = shape[i];
    const bool sliced = pick(2) == 0;
    if (sliced) stored[0] *= 2;
    Tensor base = rand(stored, DType::f64, g);
    if (sliced) base = base.slice(0, 0, stored[0], 2);
    Tensor t = base.permute(perm);  // logical shape `shape`
    REQUIRE(t.shape() == shape);

    std::vector<int64_t> dims;
    for (int64_t d = 0; d < nd; ++d)
      if (pick(2) == 0) dims.push_back(d);
    const bool keepdim = pick(2) == 0;
    INFO("trial " << trial << ": shape " << shape_str(shape) << " strides "
                  << shape_str(t.strides()) << " dims " << shape_str(dims));

    // Naive: walk every logical index, add into the output cell.
    const auto v = values(t);
    Shape kept = shape;
    for (int64_t d : (dims.empty() ? perm : dims)) kept[d] = 1;  // empty dims: all
    std::vector<double> expected(shape_numel(kept), 0.0);
    const Shape st = contiguous_strides(shape), kst = contiguous_strides(kept);
    for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
      int64_t out = 0;
      for (int64_t d = 0; d < nd; ++d) {
        const int64_t idx = (i / st[d]) % shape[d];
        if (kept[d] != 1) out += idx * kst[d];
      }
      expected[out] += v[i];
    }
    Tensor s = sum(t, dims, keepdim);
    if (keepdim) CHECK(s.shape() == kept);
    check_close(s, expected, 1e-12);

    // max along one dim.
    const int64_t d = pick(nd);
    Shape mk = shape;
    mk[d] = 1;
    const Shape mst = contiguous_strides(mk);
    std::vector<double> mx(shape_numel(mk), -1.0);
    std::vector<double> am(shape_numel(mk), 0.0);
    for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
      int64_t out = 0;
      for (int64_t e = 0; e < nd; ++e)
        if (e != d) out += ((i / st[e]) % shape[e]) * mst[e];
      if (v[i] > mx[out]) {
        mx[out] = v[i];
        am[out] = static_cast<double>((i / st[d]) % shape[d]);
      }
    }
    CHECK(values(max(t, d)) == mx);
    CHECK(values(argmax(t, d)) == am);
  }
}
