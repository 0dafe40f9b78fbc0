// Elementwise ops: values against hand-computed references with broadcasting,
// dtype promotion, non-contiguous operands, errors, and gradient checks.
#include <catch2/catch.hpp>

#include <cmath>
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

namespace {

Tensor tensor(const std::vector<double>& v, const Shape& shape, DType dtype = DType::f64) {
  return Tensor::from_vector<double>(v, shape).to(dtype);
}

}  // namespace

TEST_CASE("binary arithmetic on same shapes", "[runtime][ops][elementwise]") {
  const DType dt = GENERATE(DType::f32, DType::f64);
  Tensor a = tensor({1, 2, 3, 4, 5, 6}, {2, 3}, dt);
  Tensor b = tensor({6, 5, 4, 3, 2, 1}, {2, 3}, dt);
  CHECK(add(a, b).dtype() == dt);
  CHECK(add(a, b).shape() == Shape{2, 3});
  check_close(add(a, b), {7, 7, 7, 7, 7, 7});
  check_close(add(a, b, 0.5), {4, 4.5, 5, 5.5, 6, 6.5});
  check_close(sub(a, b), {-5, -3, -1, 1, 3, 5});
  check_close(mul(a, b), {6, 10, 12, 12, 10, 6});
  check_close(div(a, b), {1.0 / 6, 0.4, 0.75, 4.0 / 3, 2.5, 6});
  check_close(a + b, values(add(a, b)));
  check_close(a - b, values(sub(a, b)));
  check_close(a * b, values(mul(a, b)));
  check_close(a / b, values(div(a, b)));
  check_close(-a, {-1, -2, -3, -4, -5, -6});
}

TEST_CASE("broadcasting", "[runtime][ops][elementwise]") {
  const DType dt = GENERATE(DType::f32, DType::f64, DType::i64);
  Tensor m = tensor({1, 2, 3, 4, 5, 6}, {2, 3}, dt);
  Tensor row = tensor({10, 20, 30}, {3}, dt);
  Tensor col = tensor({100, 200}, {2, 1}, dt);
  Tensor r13 = tensor({1, 2, 3}, {1, 3}, dt);
  Tensor s = tensor({2}, {}, dt);

  CHECK(add(m, row).shape() == Shape{2, 3});
  check_close(add(m, row), {11, 22, 33, 14, 25, 36});
  check_close(add(row, m), {11, 22, 33, 14, 25, 36});
  check_close(sub(m, row), {-9, -18, -27, -6, -15, -24});
  check_close(mul(m, col), {100, 200, 300, 800, 1000, 1200});
  // [2, 1] + [1, 3] -> [2, 3]: both operands broadcast.
  Tensor outer = add(col, r13);
  CHECK(outer.shape() == Shape{2, 3});
  check_close(outer, {101, 102, 103, 201, 202, 203});
  check_close(mul(col, r13), {100, 200, 300, 200, 400, 600});
  // A 0-dim tensor broadcasts against anything.
  check_close(mul(m, s), {2, 4, 6, 8, 10, 12});
  check_close(sub(s, m), {1, 0, -1, -2, -3, -4});
  CHECK(add(s, s).shape().empty());
  // Leading dims are added: [3] with [4, 1, 1] -> [4, 1, 3].
  Tensor t411 = tensor({0, 1, 2, 3}, {4, 1, 1}, dt);
  Tensor big = add(row, t411);
  CHECK(big.shape() == Shape{4, 1, 3});
  check_close(big, {10, 20, 30, 11, 21, 31, 12, 22, 32, 13, 23, 33});
  // Size-0 dims broadcast too.
  CHECK(add(Tensor::zeros({0, 3}, dt), row).shape() == Shape{0, 3});
}

TEST_CASE("scalar operands", "[runtime][ops][elementwise]") {
  Tensor a = tensor({1, 2, 3}, {3}, DType::f32);
  check_close(add(a, 1.5), {2.5, 3.5, 4.5});
  check_close(a + 1.5, {2.5, 3.5, 4.5});
  check_close(a - 1.0, {0, 1, 2});
  check_close(mul(a, -2.0), {-2, -4, -6});
  check_close(2.0 * a, {2, 4, 6});
  check_close(a / 4.0, {0.25, 0.5, 0.75});
  CHECK(add(a, 1.5).dtype() == DType::f32);
  // Integer tensors stay integer for integral scalars, become f32 otherwise.
  Tensor i = tensor({1, 2, 3}, {3}, DType::i32);
  CHECK(add(i, 2.0).dtype() == DType::i32);
  check_close(add(i, 2.0), {3, 4, 5});
  CHECK(mul(i, 0.5).dtype() == DType::f32);
  check_close(mul(i, 0.5), {0.5, 1, 1.5});
}

TEST_CASE("a scalar operand of a bool, u8 or integer tensor keeps its value",
          "[runtime][ops][elementwise]") {
  // The scalar used to be converted to the tensor's dtype first: bool * -1e9
  // gave back the 0/1 mask, u8 - 1 added 255, i64 + inf added INT64_MIN.
  Tensor mask = tensor({1, 0}, {2}, DType::boolean);
  CHECK(mul(mask, -1e9).dtype() == DType::i64);
  CHECK(mul(mask, -1e9).to_vector<int64_t>() == std::vector<int64_t>{-1000000000, 0});
  CHECK(add(mask, 2.0).to_vector<int64_t>() == std::vector<int64_t>{3, 2});
  Tensor u = tensor({5, 250}, {2}, DType::u8);
  CHECK((u - 1.0).to_vector<int64_t>() == std::vector<int64_t>{4, 249});
  CHECK(add(u, 300.0).to_vector<int64_t>() == std::vector<int64_t>{305, 550});
  // A non-finite scalar gives a floating result, as any fractional one does.
  Tensor i = tensor({1, 2}, {2}, DType::i64);
  CHECK(add(i, INFINITY).dtype() == DType::f32);
  CHECK(add(i, -INFINITY).to_vector<double>() == std::vector<double>{-INFINITY, -INFINITY});
  CHECK((i / 0.0).to_vector<double>() == std::vector<double>{INFINITY, INFINITY});
  // One that an i32 cannot hold is refused, as PyTorch refuses it.
  Tensor i32 = tensor({1, 2}, {2}, DType::i32);
  CHECK_THROWS_WITH(mul(i32, 1e10), Contains("out of range") && Contains("i32"));
  CHECK(add(i32, -2147483648.0).to_vector<int64_t>() ==
        std::vector<int64_t>{-2147483647, -2147483646});
  CHECK(mul(i, 1e10).to_vector<int64_t>() == std::vector<int64_t>{10000000000, 20000000000});
}

TEST_CASE("dtype promotion of binary ops", "[runtime][ops][elementwise]") {
  Tensor f32 = tensor({1.5, 2.5}, {2}, DType::f32);
  Tensor f64 = tensor({1, 2}, {2}, DType::f64);
  Tensor i32 = tensor({3, 4}, {2}, DType::i32);
  Tensor i64 = tensor({5, 6}, {2}, DType::i64);
  Tensor b = tensor({1, 0}, {2}, DType::boolean);
  CHECK(add(f32, f64).dtype() == DType::f64);
  check_close(add(f32, f64), {2.5, 4.5});
  CHECK(add(i32, f32).dtype() == DType::f32);
  check_close(mul(i32, f32), {4.5, 10});
  CHECK(add(i32, i64).dtype() == DType::i64);
  check_close(sub(i64, i32), {2, 2});
  CHECK(add(b, b).dtype() == DType::i64);  // bool arithmetic is done in i64
  check_close(add(b, b), {2, 0});
  CHECK(add(b, f32).dtype() == DType::f32);
  // Integer arithmetic is exact beyond float precision.
  Tensor big = tensor({double(1LL << 53)}, {1}, DType::i64);
  CHECK(add(big, tensor({1}, {1}, DType::i64)).to_vector<int64_t>()[0] == (1LL << 53) + 1);
  // Half types compute in float and round on store (3 + 0.005 rounds to 3 in bf16).
  Tensor h = add(tensor({1, 3}, {2}, DType::bf16), tensor({0.5, 0.005}, {2}, DType::bf16));
  CHECK(h.dtype() == DType::bf16);
  check_close(h, {1.5, 3});
  CHECK(add(tensor({1}, {1}, DType::bf16), f32.slice(0, 0, 1)).dtype() == DType::f32);
  CHECK_THROWS_WITH(div(i32, i64), Contains("integer division"));
}

TEST_CASE("a 0-d tensor takes part in promotion only from a higher kind, as torch.result_type",
          "[runtime][ops][elementwise]") {
  // Each expected dtype is what PyTorch 1.13 gives.
  const Tensor bf16 = tensor({1, 2}, {2}, DType::bf16), f16 = tensor({1, 2}, {2}, DType::f16);
  const Tensor i32 = tensor({1, 2}, {2}, DType::i32), b = tensor({1, 0}, {2}, DType::boolean);
  const Tensor two_f32 = Tensor::scalar(2.0, DType::f32), two_f64 = Tensor::scalar(2.0, DType::f64);
  const Tensor two_i64 = Tensor::scalar(2.0, DType::i64);
  // Before, a bf16 activation times a 0-d f32 scale came back f32.
  CHECK(mul(bf16, two_f32).dtype() == DType::bf16);
  check_close(mul(bf16, two_f32), {2, 4});
  CHECK(mul(two_f32, bf16).dtype() == DType::bf16);
  CHECK(add(f16, Tensor::scalar(2.0, DType::bf16)).dtype() == DType::f16);
  CHECK(sub(f16, two_f64).dtype() == DType::f16);
  CHECK(div(bf16, two_f64).dtype() == DType::bf16);
  CHECK(add(i32, two_i64).dtype() == DType::i32);
  CHECK(gt(i32, Tensor::scalar(1.5, DType::f64)).to_vector<int64_t>() ==
        std::vector<int64_t>{0, 1});
  // A 0-d operand of a higher kind does promote.
  CHECK(add(i32, two_f64).dtype() == DType::f64);
  CHECK(add(b, two_i64).dtype() == DType::i64);
  CHECK(add(b, two_f32).dtype() == DType::f32);
  // Two 0-d operands, or two dimensioned ones, promote as always.
  CHECK(add(two_f32, two_f64).dtype() == DType::f64);
  CHECK(result_type(bf16, tensor({1}, {1}, DType::f32)) == DType::f32);
  // The gradients keep each input's dtype.
  Tensor x = tensor({1, 2}, {2}, DType::bf16).requires_grad_(true);
  Tensor s = Tensor::scalar(3.0, DType::f32).requires_grad_(true);
  sum(mul(x, s)).backward();
  CHECK(x.grad().dtype() == DType::bf16);
  CHECK(s.grad().dtype() == DType::f32);
  check_close(x.grad(), {3, 3});
  check_close(s.grad(), {3});
}

TEST_CASE("integer results refuse a fractional alpha; neg of u8 and bool",
          "[runtime][ops][elementwise]") {
  Tensor a = tensor({3, 5}, {2}, DType::i64), b = tensor({1, 1}, {2}, DType::i64);
  // add(a, b, 0.5) used to truncate alpha to 0 and return a unchanged.
  CHECK_THROWS_WITH(add(a, b, 0.5), Contains("alpha 0.5 is not a whole number"));
  CHECK(add(a, b, 2.0).to_vector<int64_t>() == std::vector<int64_t>{5, 7});
  check_close(add(a, tensor({1, 1}, {2}, DType::f32), 0.5), {3.5, 5.5});
  // -1 as a u8 was 255: neg(200) gave 51000.
  Tensor u = tensor({0, 1, 2, 200}, {4}, DType::u8);
  CHECK(neg(u).to_vector<int64_t>() == std::vector<int64_t>{0, -1, -2, -200});
  CHECK_THROWS_WITH(neg(tensor({0, 1}, {2}, DType::boolean)), Contains("bool"));
}

TEST_CASE("integer results refuse an alpha outside their arithmetic's range",
          "[runtime][ops][elementwise]") {
  // Converted anyway, such an alpha was undefined: 1 + 1e30 * 1 gave INT64_MIN + 1.
  Tensor i64 = tensor({1, 2}, {2}, DType::i64), i32 = tensor({1, 2}, {2}, DType::i32);
  CHECK_THROWS_WITH(add(i64, i64, 1e30), Contains("alpha 1e+30 is out of range for the i64"));
  CHECK_THROWS_WITH(add(i32, i32, 1e10), Contains("alpha 10000000000 is out of range"));
  // u8 and bool add in i64, so an alpha past u8's range is fine.
  Tensor u = tensor({1, 2}, {2}, DType::u8);
  CHECK(add(u, u, 300.0).to_vector<int64_t>() == std::vector<int64_t>{301, 602});
  CHECK(add(i32, i64, 1e10).to_vector<int64_t>() == std::vector<int64_t>{10000000001,
                                                                         20000000002});
}

TEST_CASE("mismatched shapes name both shapes", "[runtime][ops][elementwise]") {
  Tensor a = Tensor::zeros({2, 3});
  CHECK_THROWS_AS(add(a, Tensor::zeros({2})), lockstep::Error);
  CHECK_THROWS_WITH(add(a, Tensor::zeros({2})), Contains("[2, 3]") && Contains("[2]"));
  CHECK_THROWS_WITH(mul(a, Tensor::zeros({3, 3})), Contains("[3, 3]") && Contains("broadcast"));
  CHECK(broadcast_shapes({2, 1, 4}, {3, 1}) == Shape{2, 3, 4});
  CHECK(broadcast_shapes({}, {5}) == Shape{5});
  CHECK(broadcast_shapes({0}, {1}) == Shape{0});
  CHECK_THROWS_WITH(broadcast_shapes({4}, {0}), Contains("[4]") && Contains("[0]"));
}

TEST_CASE("sum_to undoes broadcasting", "[runtime][ops][elementwise]") {
  Tensor g = tensor({1, 2, 3, 4, 5, 6}, {2, 3});
  check_close(sum_to(g, {3}), {5, 7, 9});
  check_close(sum_to(g, {1, 3}), {5, 7, 9});
  check_close(sum_to(g, {2, 1}), {6, 15});
  check_close(sum_to(g, {}), {21});
  CHECK(sum_to(g, {}).shape().empty());
  CHECK(sum_to(g, {2, 1}).shape() == Shape{2, 1});
  CHECK(sum_to(g, {2, 3}).is_same(g));
}

TEST_CASE("non-contiguous operands", "[runtime][ops][elementwise]") {
  Tensor m = tensor({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor mt = m.t();  // [[1, 4], [2, 5], [3, 6]]
  Tensor n = tensor({10, 20, 30, 40, 50, 60}, {3, 2});
  check_close(add(mt, n), {11, 24, 32, 45, 53, 66});
  check_close(mul(mt, mt), {1, 16, 4, 25, 9, 36});
  Tensor stepped = tensor({0, 1, 2, 3, 4, 5, 6, 7}, {8}).slice(0, 1, 8, 3);  // 1, 4, 7
  check_close(sub(stepped, tensor({1, 1, 1}, {3})), {0, 3, 6});
  check_close(exp(mt), {std::exp(1.0), std::exp(4.0), std::exp(2.0), std::exp(5.0),
                        std::exp(3.0), std::exp(6.0)});
  Tensor e = tensor({1, 2}, {2, 1}).expand({2, 3});
  check_close(mul(e, m), {1, 2, 3, 8, 10, 12});
  check_close(sqrt(e), {1, 1, 1, std::sqrt(2.0), std::sqrt(2.0), std::sqrt(2.0)});
}

TEST_CASE("unary ops", "[runtime][ops][elementwise]") {
  const DType dt = GENERATE(DType::f32, DType::f64);
  Tensor x = tensor({0.5, 1, 2, 4}, {2, 2}, dt);
  check_close(neg(x), {-0.5, -1, -2, -4});
  check_close(exp(x), {std::exp(0.5), std::exp(1.0), std::exp(2.0), std::exp(4.0)});
  check_close(log(x), {std::log(0.5), 0, std::log(2.0), std::log(4.0)});
  check_close(sqrt(x), {std::sqrt(0.5), 1, std::sqrt(2.0), 2});
  check_close(pow(x, 2.0), {0.25, 1, 4, 16});
  check_close(pow(x, 3.0), {0.125, 1, 8, 64});
  check_close(pow(x, 0.5), values(sqrt(x)));
  check_close(pow(x, -1.0), {2, 1, 0.5, 0.25});
  check_close(abs(tensor({-1.5, 0, 2}, {3}, dt)), {1.5, 0, 2});
  CHECK(exp(x).dtype() == dt);
  CHECK(exp(x).shape() == Shape{2, 2});
  CHECK(std::isinf(values(log(tensor({0}, {1}, dt)))[0]));
  CHECK_THROWS_WITH(exp(Tensor::ones({2}, DType::i32)), Contains("exp") && Contains("i32"));
  CHECK(neg(Tensor::ones({2}, DType::i64)).dtype() == DType::i64);
}

TEST_CASE("comparisons give bool tensors", "[runtime][ops][elementwise]") {
  Tensor a = tensor({1, 2, 3}, {3}, DType::f32);
  Tensor b = tensor({3, 2, 1}, {3}, DType::i64);
  Tensor e = eq(a, b);
  CHECK(e.dtype() == DType::boolean);
  CHECK(values(e) == std::vector<double>{0, 1, 0});
  CHECK(values(gt(a, b)) == std::vector<double>{0, 0, 1});
  // Broadcasting, and no gradient.
  Tensor x = random_input({2, 3}, 1);
  Tensor g = gt(x, Tensor::scalar(0.0, DType::f64));
  CHECK(g.shape() == Shape{2, 3});
  CHECK_FALSE(g.requires_grad());
  CHECK(values(eq(tensor({1, 2}, {2, 1}), tensor({1, 2}, {1, 2}))) ==
        std::vector<double>{1, 0, 0, 1});
}

TEST_CASE("elementwise gradients match finite differences", "[runtime][ops][elementwise][gradcheck]") {
  Tensor a = random_input({2, 3}, 1);
  Tensor b = random_input({2, 3}, 2);
  Tensor row = random_input({3}, 3);
  Tensor col = random_input({2, 1}, 4);
  Tensor r13 = random_input({1, 3}, 5);
  Tensor s = random_input({}, 6);
  Tensor pos = random_input({2, 3}, 7, 0.5, 2.0);  // away from 0 for log, sqrt, div
  Tensor pos_row = random_input({3}, 8, 0.5, 2.0);
  Tensor t32 = random_input({3, 2}, 9);  // transposed below: a non-contiguous operand

  check_grad("add", [](auto& in) { return add(in[0], in[1]); }, {a, b});
  check_grad("add alpha", [](auto& in) { return add(in[0], in[1], -2.5); }, {a, b});
  check_grad("add [2,3]+[3]", [](auto& in) { return add(in[0], in[1]); }, {a, row});
  check_grad("add [2,1]+[1,3]", [](auto& in) { return add(in[0], in[1]); }, {col, r13});
  check_grad("sub [3]-[2,3]", [](auto& in) { return sub(in[0], in[1]); }, {row, a});
  check_grad("sub [2,1]-[1,3]", [](auto& in) { return sub(in[0], in[1]); }, {col, r13});
  check_grad("mul", [](auto& in) { return mul(in[0], in[1]); }, {a, b});
  check_grad("mul [2,3]*[]", [](auto& in) { return mul(in[0], in[1]); }, {a, s});
  check_grad("mul [2,1]*[1,3]", [](auto& in) { return mul(in[0], in[1]); }, {col, r13});
  check_grad("div", [](auto& in) { return div(in[0], in[1]); }, {a, pos});
  check_grad("div [2,3]/[3]", [](auto& in) { return div(in[0], in[1]); }, {a, pos_row});
  check_grad("div []/[2,3]", [](auto& in) { return div(in[0], in[1]); }, {s, pos});
  check_grad("add scalar", [](auto& in) { return add(in[0], 3.0); }, {a});
  check_grad("mul scalar", [](auto& in) { return mul(in[0], -1.5); }, {a});
  check_grad("neg", [](auto& in) { return neg(in[0]); }, {a});
  check_grad("exp", [](auto& in) { return exp(in[0]); }, {a});
  check_grad("log", [](auto& in) { return log(in[0]); }, {pos});
  check_grad("sqrt", [](auto& in) { return sqrt(in[0]); }, {pos});
  check_grad("pow 2", [](auto& in) { return pow(in[0], 2.0); }, {a});
  check_grad("pow 3", [](auto& in) { return pow(in[0], 3.0); }, {a});
  check_grad("pow -1.5", [](auto& in) { return pow(in[0], -1.5); }, {pos});
  check_grad("abs", [](auto& in) { return abs(in[0]); }, {a});
  check_grad("non-contiguous mul", [](auto& in) { return mul(in[0].t(), in[1]); }, {t32, b});
  check_grad("non-contiguous add broadcast",
             [](auto& in) { return add(in[0].t(), in[1]); }, {t32, row});
  check_grad("same input twice", [](auto& in) { return mul(in[0], in[0]); }, {a});
  check_grad("composite", [](auto& in) {
    return div(exp(mul(in[0], in[1])), add(mul(in[2], in[2]), 1.0));
  }, {a, row, col});
}

TEST_CASE("pow gradients at zero", "[runtime][ops][elementwise]") {
  Tensor x = Tensor::from_vector<double>({0, 2}, {2});
  x.requires_grad_();
  sum(pow(x, 0.0)).backward();  // constant: zero gradient, not NaN at 0
  CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 0});
  x.set_grad(Tensor());
  sum(pow(x, 2.0)).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 4});
  x.set_grad(Tensor());
  sum(pow(x, 1.0)).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{1, 1});
}

TEST_CASE("div's gradient for the divisor does not square it", "[runtime][ops][elementwise]") {
  // -g * a / b^2 as (a / b) / b, PyTorch's order: b * b overflows f16 past
  // 256 (a zero gradient) and underflows for a small b (NaN where a is 0).
  Tensor a = tensor({1000, 0}, {2}, DType::f16);
  Tensor b = tensor({300, 1e-4}, {2}, DType::f16);
  b.requires_grad_();
  sum(div(a, b)).backward();
  const std::vector<double> g = b.grad().to_vector<double>();
  CHECK(g[0] == Approx(-1000.0 / (300.0 * 300.0)).epsilon(1e-3));
  CHECK(g[1] == 0.0);

  Tensor zero = Tensor::zeros({1});
  Tensor tiny = Tensor::full({1}, 1e-23);
  tiny.requires_grad_();
  sum(div(zero, tiny)).backward();
  CHECK(tiny.grad().to_vector<double>() == std::vector<double>{0});
}

TEST_CASE("gradients flow only where needed and keep each input's dtype",
          "[runtime][ops][elementwise]") {
  Tensor a = Tensor::ones({2, 3}, DType::f32);
  a.requires_grad_();
  Tensor b = Tensor::full({3}, 2.0, DType::f64);  // no grad
  Tensor y = mul(a, b);
  CHECK(y.dtype() == DType::f64);
  sum(y).backward();
  CHECK(a.grad().dtype() == DType::f32);
  CHECK(values(a.grad()) == std::vector<double>(6, 2.0));
  CHECK_FALSE(b.grad().defined());

  Tensor c = Tensor::ones({3}, DType::f64);
  c.requires_grad_();
  Tensor i = Tensor::arange(3, DType::i64).reshape({3, 1});
  sum(mul(c, i)).backward();  // [3] * [3, 1] -> [3, 3]: c gets the column sums of i
  CHECK(values(c.grad()) == std::vector<double>{3, 3, 3});
}

TEST_CASE("broadcast arithmetic on random shapes and layouts matches a naive loop",
          "[runtime][ops][elementwise]") {
  Generator g(31);
  auto pick = [&](int64_t n) { return static_cast<int64_t>(g.next_u32() % static_cast<uint32_t>(n)); };
  // A tensor with logical shape `shape` stored permuted, or as an expanded
  // size-1 dim, or a stepped slice.
  auto make = [&](const Shape& shape) {
    const int64_t nd = static_cast<int64_t>(shape.size());
    if (nd == 0) return rand({}, DType::f64, g);
    switch (pick(3)) {
      case 0: {
        Shape rev(shape.rbegin(), shape.rend());
        std::vector<int64_t> perm(nd);
        for (int64_t i = 0; i < nd; ++i) perm[i] = nd - 1 - i;
        return rand(rev, DType::f64, g).permute(perm);
      }
      case 1: {
        Shape wide = shape;
        wide.back() *= 3;
        return rand(wide, DType::f64, g).slice(-1, 1, wide.back(), 3);
      }
      default:
        return rand(shape, DType::f64, g);
    }
  };
  for (int trial = 0; trial < 200; ++trial) {
    // Output shape, then each operand drops leading dims and sets some to 1.
    Shape out;
    const int64_t nd = pick(4);
    for (int64_t d = 0; d < nd; ++d) out.push_back(1 + pick(4));
    auto operand_shape = [&] {
      Shape s(out.begin() + pick(nd + 1), out.end());
      for (int64_t& v : s)
        if (pick(3) == 0) v = 1;
      return s;
    };
    Tensor a = make(operand_shape()), b = make(operand_shape());
    INFO("trial " << trial << ": " << shape_str(a.shape()) << " strides " << shape_str(a.strides())
                  << " with " << shape_str(b.shape()) << " strides " << shape_str(b.strides()));
    const Shape shape = broadcast_shapes(a.shape(), b.shape());
    const auto av = values(a), bv = values(b);
    // Element i of the result reads a and b at the broadcast index.
    auto at = [&](const Tensor& t, const std::vector<double>& tv, int64_t i) {
      const Shape ost = contiguous_strides(shape), tst = contiguous_strides(t.shape());
      const size_t lead = shape.size() - t.shape().size();
      int64_t k = 0;
      for (size_t d = lead; d < shape.size(); ++d) {
        const int64_t idx = (i / ost[d]) % shape[d];
        if (t.shape()[d - lead] != 1) k += idx * tst[d - lead];
      }
      return tv[k];
    };
    std::vector<double> sum_ref, prod_ref;
    for (int64_t i = 0; i < shape_numel(shape); ++i) {
      sum_ref.push_back(at(a, av, i) + 2 * at(b, bv, i));
      prod_ref.push_back(at(a, av, i) * at(b, bv, i));
    }
    CHECK(add(a, b, 2.0).shape() == shape);
    check_close(add(a, b, 2.0), sum_ref, 1e-12);
    check_close(mul(a, b), prod_ref, 1e-12);
    // In place: a tensor of the broadcast shape accumulates a, then 2 b.
    Tensor acc = Tensor::zeros(shape, DType::f64);
    acc.copy_(a);
    acc.add_(b, 2.0);
    check_close(acc, sum_ref, 1e-12);
  }
}
