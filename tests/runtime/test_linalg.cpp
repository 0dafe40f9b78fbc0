// matmul and linear: values against a naive triple loop for every supported
// shape and layout (transposed, sliced, expanded operands), errors, and
// gradient checks.
#include <catch2/catch.hpp>

#include <vector>

#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/ops/detail/gemm.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/linalg.h"
#include "lockstep/runtime/ops/reduce.h"
#include "lockstep/runtime/random.h"
#include "lockstep/runtime/tensor.h"
#include "support/gradcheck.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

namespace {

// a [m, k] x b [k, n] by the definition, in double, from any layout.
std::vector<double> naive_mm(const Tensor& a, const Tensor& b) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  auto av = values(a), bv = values(b);
  std::vector<double> c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p) c[i * n + j] += av[i * k + p] * bv[p * n + j];
  return c;
}

double tolerance(DType dt) { return dt == DType::f32 ? 1e-5 : 1e-12; }

}  // namespace

TEST_CASE("matmul of 2-D matrices", "[runtime][ops][linalg]") {
  const DType dt = GENERATE(DType::f32, DType::f64);
  Tensor a = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}).to(dt);
  Tensor b = Tensor::from_vector<double>({7, 8, 9, 10, 11, 12}, {3, 2}).to(dt);
  Tensor c = matmul(a, b);
  CHECK(c.shape() == Shape{2, 2});
  CHECK(c.dtype() == dt);
  CHECK(values(c) == std::vector<double>{58, 64, 139, 154});

  Generator g(1);
  struct Dims {
    int64_t m, k, n;
  };
  const Dims d = GENERATE(Dims{1, 1, 1}, Dims{1, 5, 1}, Dims{4, 1, 3}, Dims{1, 7, 3},
                          Dims{5, 3, 1}, Dims{17, 9, 13}, Dims{64, 33, 48});
  INFO(d.m << "x" << d.k << "x" << d.n);
  Tensor x = rand({d.m, d.k}, dt, g), y = rand({d.k, d.n}, dt, g);
  check_close(matmul(x, y), naive_mm(x, y), tolerance(dt));
}

TEST_CASE("matmul reads transposed, sliced and expanded operands", "[runtime][ops][linalg]") {
  const DType dt = GENERATE(DType::f32, DType::f64);
  Generator g(2);
  Tensor a = rand({6, 4}, dt, g);   // a.t() is [4, 6]
  Tensor b = rand({5, 6}, dt, g);   // b.t() is [6, 5]
  Tensor ac = a.t().contiguous(), bc = b.t().contiguous();
  const double tol = tolerance(dt);
  check_close(matmul(a.t(), bc), naive_mm(ac, bc), tol);
  check_close(matmul(ac, b.t()), naive_mm(ac, bc), tol);
  check_close(matmul(a.t(), b.t()), naive_mm(ac, bc), tol);
  // A row-major matrix with a row stride larger than its width (a column slice).
  Tensor wide = rand({4, 10}, dt, g);
  Tensor cols = wide.slice(1, 2, 8);  // [4, 6], strides [10, 1]
  check_close(matmul(cols, bc), naive_mm(cols.contiguous(), bc), tol);
  check_close(matmul(a.t(), cols.t()), naive_mm(ac, cols.t().contiguous()), tol);
  // Unit stride in neither dim: stepped slices and expanded views are copied.
  Tensor stepped = rand({8, 12}, dt, g).slice(0, 0, 8, 2).slice(1, 0, 12, 2);  // [4, 6]
  check_close(matmul(stepped, bc), naive_mm(stepped.contiguous(), bc), tol);
  Tensor expanded = rand({1, 6}, dt, g).expand({4, 6});
  check_close(matmul(expanded, bc), naive_mm(expanded.contiguous(), bc), tol);
  Tensor bcol = rand({6, 1}, dt, g).expand({6, 5});
  check_close(matmul(ac, bcol), naive_mm(ac, bcol.contiguous()), tol);
  // The inputs are left alone.
  CHECK(values(a.t()) == values(ac));
}

TEST_CASE("matmul of [.., m, k] by [k, n] and batched 3-D", "[runtime][ops][linalg]") {
  const DType dt = GENERATE(DType::f32, DType::f64);
  Generator g(3);
  const double tol = tolerance(dt);
  Tensor a = rand({2, 3, 4}, dt, g), w = rand({4, 5}, dt, g);
  Tensor c = matmul(a, w);
  CHECK(c.shape() == Shape{2, 3, 5});
  std::vector<double> expected;
  for (int64_t i = 0; i < 2; ++i) {
    auto part = naive_mm(a.select(0, i), w);
    expected.insert(expected.end(), part.begin(), part.end());
  }
  check_close(c, expected, tol);
  // 4-D on the left is flattened the same way.
  Tensor a4 = rand({2, 2, 3, 4}, dt, g);
  CHECK(matmul(a4, w).shape() == Shape{2, 2, 3, 5});
  check_close(matmul(a4, w), naive_mm(a4.reshape({12, 4}), w), tol);
  // A non-contiguous left operand.
  Tensor at = rand({4, 3, 2}, dt, g).permute({2, 1, 0});  // [2, 3, 4]
  check_close(matmul(at, w), naive_mm(at.reshape({6, 4}), w), tol);

  // Batched: [b, m, k] x [b, k, n].
  Tensor bb = rand({2, 4, 5}, dt, g);
  Tensor cb = matmul(a, bb);
  CHECK(cb.shape() == Shape{2, 3, 5});
  expected.clear();
  for (int64_t i = 0; i < 2; ++i) {
    auto part = naive_mm(a.select(0, i), bb.select(0, i));
    expected.insert(expected.end(), part.begin(), part.end());
  }
  check_close(cb, expected, tol);
  // Batched with transposed matrices inside.
  Tensor bt = bb.transpose(1, 2).contiguous().transpose(1, 2);  // same values, [b, n, k] memory
  check_close(matmul(a, bt), expected, tol);
  Tensor a_t = a.transpose(1, 2).contiguous().transpose(1, 2);
  check_close(matmul(a_t, bt), expected, tol);
}

namespace {

// Small whole numbers, exact in every float dtype: element i is (i + offset) % 7 - 3.
Tensor ramp(const Shape& shape, int64_t offset, DType dt) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i)
    v[static_cast<size_t>(i)] = static_cast<double>((i + offset) % 7) - 3;
  return Tensor::from_vector<double>(v, shape).to(dt);
}

}  // namespace

TEST_CASE("matmul follows torch.matmul's rules for 1-D operands and broadcast batch dims",
          "[runtime][ops][linalg]") {
  // Expected values from torch.matmul (1.13) on the same ramps.
  struct Case {
    const char* what;
    Shape a, b;
    bool transpose_b;  // b.transpose(-2, -1): k of a [B, H, T, D] as in q @ k^T
    Shape out;
    std::vector<double> want;
  };
  const std::vector<Case> cases = {
      {"dot", {3}, {3}, false, {}, {2}},
      {"vector x matrix", {3}, {3, 2}, false, {2}, {-2, -1}},
      {"matrix x vector", {2, 3}, {3}, false, {2}, {2, 2}},
      {"batch x vector", {2, 2, 3}, {3}, false, {2, 2}, {2, 2, -5, 2}},
      {"vector x batch", {3}, {2, 3, 2}, false, {2, 2}, {-2, -1, 4, -2}},
      {"q @ k^T", {2, 2, 3, 4}, {2, 2, 3, 4}, true, {2, 2, 3, 3},
       {2,  -1, -4, -4, -6, -1, 4,  -4, 2,  -9, 5,  -9, 2, -4, 4,  -1, -6, -4,
        -9, 8,  -10, -9, 2, -1, 5,  -4, -6, 2,  8,  -7, -9, -9, 5, 8,  2, -4}},
      {"[1, m, k] x [b, k, n]", {1, 2, 3}, {2, 3, 2}, false, {2, 2, 2},
       {-2, -1, 7, -4, 4, -2, 4, 7}},
      {"matrix x batch", {2, 3}, {2, 3, 2}, false, {2, 2, 2}, {-2, -1, 7, -4, 4, -2, 4, 7}},
      {"4-D x 3-D, both broadcast", {2, 1, 2, 3}, {3, 3, 2}, false, {2, 3, 2, 2},
       {-2, -1, 7, -4, 4,   -2,  4, 7, 10, 4,   1, 4,
        -12, 0, 4, -3, -10, -12, 4, 4, -8, -10, 4, 4}},
  };
  const DType dt = GENERATE(DType::f32, DType::f64, DType::bf16);
  for (const Case& c : cases) {
    INFO(c.what << " in " << dtype_name(dt));
    Tensor a = ramp(c.a, 0, dt), b = ramp(c.b, 2, dt);
    if (c.transpose_b) b = b.transpose(-2, -1);
    Tensor out = matmul(a, b);
    CHECK(out.shape() == c.out);
    CHECK(out.dtype() == dt);
    CHECK(values(out) == c.want);
    // The same product from operands in another layout.
    CHECK(values(matmul(a.contiguous(), b.contiguous())) == c.want);
  }
}

TEST_CASE("a broadcast matmul leaves its operands alone and runs under autocast",
          "[runtime][ops][linalg]") {
  Tensor a = ramp({1, 2, 3}, 0, DType::f32), b = ramp({2, 3, 2}, 2, DType::f32);
  const auto a_before = values(a), b_before = values(b);
  Tensor out;
  {
    auto scope = autocast({.dtype = DType::bf16});
    out = matmul(a, b);
  }
  CHECK(out.dtype() == DType::bf16);
  CHECK(values(out) == std::vector<double>{-2, -1, 7, -4, 4, -2, 4, 7});
  CHECK(values(a) == a_before);
  CHECK(values(b) == b_before);
  // Empty batch, m and k dims broadcast too.
  CHECK(matmul(Tensor::ones({0, 1, 2, 3}), Tensor::ones({4, 3, 5})).shape() ==
        Shape{0, 4, 2, 5});
  Tensor k0 = matmul(Tensor::ones({3, 1, 0}), Tensor::ones({1, 3, 0, 2}));
  CHECK(k0.shape() == Shape{1, 3, 1, 2});
  CHECK(values(k0) == std::vector<double>(6, 0.0));
  CHECK(matmul(Tensor::ones({0}), Tensor::ones({0})).shape() == Shape{});
  // Strided vectors: every other element of [-3, -2, -1, 0, 1, 2].
  Tensor v = ramp({6}, 0, DType::f64);
  Tensor odd = v.slice(0, 0, 6, 2), even = v.slice(0, 1, 6, 2);  // [-3, -1, 1], [-2, 0, 2]
  CHECK(values(matmul(odd, even)) == std::vector<double>{8});
  CHECK(values(matmul(ramp({2, 3}, 0, DType::f64), even)) == std::vector<double>{4, 4});
  CHECK(values(matmul(odd, ramp({3, 2}, 0, DType::f64))) == std::vector<double>{11, 8});
}

TEST_CASE("matmul with empty dims", "[runtime][ops][linalg]") {
  CHECK(matmul(Tensor::zeros({0, 3}), Tensor::zeros({3, 4})).shape() == Shape{0, 4});
  Tensor k0 = matmul(Tensor::ones({2, 0}), Tensor::ones({0, 3}));
  CHECK(k0.shape() == Shape{2, 3});
  CHECK(values(k0) == std::vector<double>(6, 0.0));
}

TEST_CASE("matmul and linear backward with an empty inner or outer dim", "[runtime][ops][linalg]") {
  // k == 0: the product is zeros, and the gradients are empty or zeros.
  for (const Shape& sa : {Shape{4, 0}, Shape{2, 4, 0}}) {
    INFO(shape_str(sa));
    Tensor a = Tensor::ones(sa).requires_grad_();
    Tensor b = Tensor::ones({0, 3}).requires_grad_();
    sum(matmul(a, b)).backward();
    CHECK(a.grad().shape() == sa);
    CHECK(b.grad().shape() == Shape{0, 3});
  }
  Tensor x = Tensor::ones({5, 0}).requires_grad_();
  Tensor w = Tensor::ones({3, 0}).requires_grad_();
  Tensor bias = Tensor::ones({3}).requires_grad_();
  sum(linear(x, w, bias)).backward();
  CHECK(x.grad().shape() == Shape{5, 0});
  CHECK(w.grad().shape() == Shape{3, 0});
  CHECK(values(bias.grad()) == std::vector<double>(3, 5.0));
  // n == 0: an empty product, and zero gradients for the operands.
  Tensor a = Tensor::ones({4, 2}).requires_grad_();
  Tensor b = Tensor::ones({2, 0}).requires_grad_();
  sum(matmul(a, b)).backward();
  CHECK(values(a.grad()) == std::vector<double>(8, 0.0));
}

TEST_CASE("matmul shape and dtype errors", "[runtime][ops][linalg]") {
  Tensor a = Tensor::zeros({2, 3});
  CHECK_THROWS_WITH(matmul(a, Tensor::zeros({4, 2})),
                    Contains("inner dimensions") && Contains("[2, 3]") && Contains("[4, 2]"));
  CHECK_THROWS_WITH(matmul(Tensor::zeros({2}), Tensor::zeros({3, 2})),
                    Contains("inner dimensions") && Contains("[2] x [3, 2]"));
  CHECK_THROWS_WITH(matmul(a, Tensor::zeros({2})),
                    Contains("inner dimensions") && Contains("[2, 3] x [2]"));
  CHECK_THROWS_WITH(matmul(Tensor::zeros({3}), Tensor::zeros({2})),
                    Contains("inner dimensions") && Contains("(3 vs 2)"));
  CHECK_THROWS_WITH(matmul(Tensor::zeros({2, 2, 4}), Tensor::zeros({2, 3, 2})),
                    Contains("inner dimensions") && Contains("[2, 2, 4] x [2, 3, 2]"));
  CHECK_THROWS_WITH(matmul(Tensor::zeros({2, 2, 3}), Tensor::zeros({3, 3, 2})),
                    Contains("batch dims of [2, 2, 3] and [3, 3, 2] do not broadcast") &&
                        Contains("2 vs 3"));
  CHECK_THROWS_WITH(matmul(Tensor::zeros({4, 2, 2, 3}), Tensor::zeros({3, 1, 3, 2})),
                    Contains("[4, 2, 2, 3] and [3, 1, 3, 2]") && Contains("batch dim 0: 4 vs 3"));
  CHECK_THROWS_WITH(matmul(Tensor::zeros({2, 2, 3}), Tensor::zeros({3, 3, 3, 2})),
                    Contains("batch dim 1: 2 vs 3"));
  // 0-d operands are refused, as torch.matmul refuses them.
  CHECK_THROWS_WITH(matmul(Tensor::zeros({}), Tensor::zeros({2, 3})),
                    Contains("at least 1 dim") && Contains("[] x [2, 3]") && Contains("mul()"));
  CHECK_THROWS_WITH(matmul(Tensor::zeros({3}), Tensor::zeros({})), Contains("[3] x []"));
  CHECK_THROWS_WITH(matmul(Tensor::zeros({}), Tensor::zeros({})), Contains("at least 1 dim"));
  CHECK_THROWS_WITH(matmul(a, Tensor::zeros({3, 2}, DType::f64)),
                    Contains("f32") && Contains("f64"));
  CHECK_THROWS_WITH(matmul(Tensor::zeros({2, 3}, DType::i32), Tensor::zeros({3, 2}, DType::i32)),
                    Contains("i32"));
}

TEST_CASE("linear with and without bias", "[runtime][ops][linalg]") {
  const DType dt = GENERATE(DType::f32, DType::f64);
  const double tol = tolerance(dt);
  Tensor x = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}).to(dt);
  Tensor w = Tensor::from_vector<double>({1, 0, -1, 2, 1, 0}, {2, 3}).to(dt);
  Tensor b = Tensor::from_vector<double>({0.5, -1}, {2}).to(dt);
  Tensor y = linear(x, w, b);
  CHECK(y.shape() == Shape{2, 2});
  CHECK(y.dtype() == dt);
  check_close(y, {-1.5, 3, -1.5, 12}, tol);
  check_close(linear(x, w), {-2, 4, -2, 13}, tol);

  // 1-D and 3-D inputs keep their leading shape.
  Tensor y1 = linear(x.select(0, 1), w, b);
  CHECK(y1.shape() == Shape{2});
  check_close(y1, {-1.5, 12}, tol);
  Generator g(4);
  Tensor x3 = rand({2, 3, 3}, dt, g), w3 = rand({4, 3}, dt, g), b3 = rand({4}, dt, g);
  Tensor y3 = linear(x3, w3, b3);
  CHECK(y3.shape() == Shape{2, 3, 4});
  auto ref = naive_mm(x3.reshape({6, 3}), w3.t());
  auto bv = values(b3);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] += bv[i % 4];
  check_close(y3, ref, tol);
  // A transposed input.
  Tensor xt = rand({3, 5}, dt, g).t();
  check_close(linear(xt, w3), naive_mm(xt.contiguous(), w3.t()), tol);
}

TEST_CASE("linear errors name the shapes", "[runtime][ops][linalg]") {
  Tensor x = Tensor::zeros({2, 3});
  CHECK_THROWS_WITH(linear(x, Tensor::zeros({4, 5})),
                    Contains("3 features") && Contains("[4, 5]"));
  CHECK_THROWS_WITH(linear(x, Tensor::zeros({3})), Contains("weight"));
  CHECK_THROWS_WITH(linear(x, Tensor::zeros({4, 3}), Tensor::zeros({3})),
                    Contains("bias") && Contains("[4]"));
}

TEST_CASE("matmul and linear gradients match finite differences",
          "[runtime][ops][linalg][gradcheck]") {
  Tensor a = random_input({3, 4}, 1);
  Tensor b = random_input({4, 5}, 2);
  Tensor at = random_input({4, 3}, 3);  // used as at.t(): a transposed operand
  Tensor bt = random_input({5, 4}, 4);
  Tensor a3 = random_input({2, 3, 4}, 5);
  Tensor b3 = random_input({2, 4, 5}, 6);
  Tensor x = random_input({6, 4}, 7);
  Tensor w = random_input({3, 4}, 8);
  Tensor bias = random_input({3}, 9);
  Tensor x3 = random_input({2, 2, 4}, 10);

  check_grad("matmul 2-D", [](auto& in) { return matmul(in[0], in[1]); }, {a, b});
  check_grad("matmul a.t()", [](auto& in) { return matmul(in[0].t(), in[1]); }, {at, b});
  check_grad("matmul b.t()", [](auto& in) { return matmul(in[0], in[1].t()); }, {a, bt});
  check_grad("matmul both transposed", [](auto& in) { return matmul(in[0].t(), in[1].t()); },
             {at, bt});
  check_grad("matmul [b,m,k]x[k,n]", [](auto& in) { return matmul(in[0], in[1]); }, {a3, b});
  check_grad("matmul batched", [](auto& in) { return matmul(in[0], in[1]); }, {a3, b3});
  check_grad("matmul batched transposed",
             [](auto& in) { return matmul(in[0], in[1].transpose(1, 2).contiguous().transpose(1, 2)); },
             {a3, b3});
  check_grad("matmul dot", [](auto& in) { return matmul(in[0], in[1]); },
             {random_input({4}, 11), random_input({4}, 12)});
  check_grad("matmul vector x matrix", [](auto& in) { return matmul(in[0], in[1]); },
             {random_input({4}, 13), b});
  check_grad("matmul matrix x vector", [](auto& in) { return matmul(in[0], in[1]); },
             {a, random_input({4}, 14)});
  check_grad("matmul batch x vector", [](auto& in) { return matmul(in[0], in[1]); },
             {a3, random_input({4}, 15)});
  check_grad("matmul vector x batch", [](auto& in) { return matmul(in[0], in[1]); },
             {random_input({4}, 16), b3});
  check_grad("matmul q @ k^T",
             [](auto& in) { return matmul(in[0], in[1].transpose(-2, -1)); },
             {random_input({2, 2, 3, 4}, 17), random_input({2, 2, 3, 4}, 18)});
  check_grad("matmul [1,m,k] x [b,k,n]", [](auto& in) { return matmul(in[0], in[1]); },
             {random_input({1, 3, 4}, 19), b3});
  check_grad("matmul [b,m,k] x [1,k,n]", [](auto& in) { return matmul(in[0], in[1]); },
             {a3, random_input({1, 4, 5}, 20)});
  check_grad("matmul matrix x batch", [](auto& in) { return matmul(in[0], in[1]); }, {a, b3});
  check_grad("matmul 4-D x 3-D, both broadcast",
             [](auto& in) { return matmul(in[0], in[1]); },
             {random_input({2, 1, 3, 4}, 21), random_input({3, 4, 2}, 22)});
  check_grad("matmul broadcast, same operand twice",
             [](auto& in) { return matmul(in[0], in[0].transpose(-2, -1).unsqueeze(0)); },
             {random_input({2, 3, 4}, 23)});
  check_grad("matmul same operand twice", [](auto& in) { return matmul(in[0], in[0].t()); }, {a});
  check_grad("linear with bias", [](auto& in) { return linear(in[0], in[1], in[2]); },
             {x, w, bias});
  check_grad("linear without bias", [](auto& in) { return linear(in[0], in[1]); }, {x, w});
  check_grad("linear 3-D input", [](auto& in) { return linear(in[0], in[1], in[2]); },
             {x3, w, bias});
  check_grad("linear transposed input", [](auto& in) { return linear(in[0].t(), in[1]); },
             {at, w});
}

TEST_CASE("linear computes only the gradients that are needed", "[runtime][ops][linalg]") {
  Tensor x = Tensor::ones({2, 3});
  Tensor w = Tensor::ones({4, 3});
  Tensor b = Tensor::zeros({4});
  w.requires_grad_();
  sum(linear(x, w, b)).backward();
  CHECK(values(w.grad()) == std::vector<double>(12, 2.0));  // column sums of x
  CHECK_FALSE(x.grad().defined());
  CHECK_FALSE(b.grad().defined());
  b.requires_grad_();
  sum(linear(x, w, b)).backward();
  CHECK(values(b.grad()) == std::vector<double>(4, 2.0));
  CHECK(values(w.grad()) == std::vector<double>(12, 4.0));
}

TEST_CASE("a CPU matrix product past OpenBLAS's 32-bit sizes is refused, not wrapped",
          "[runtime][ops][linalg]") {
  // No memory is touched: the sizes are checked before OpenBLAS is called
  // (2^31 rows of f32 would be 8 GiB; narrowing it gave a product of 0 rows).
  const int64_t big = int64_t{1} << 31;
  float one = 1;
  CHECK_THROWS_WITH(lockstep::runtime::detail::gemm(false, false, big, 1, 1, 1.0f, &one, 1, &one,
                                                    1, 0.0f, &one, 1),
                    Contains("m = 2147483648 does not fit OpenBLAS's 32-bit sizes"));
  double d = 1;
  CHECK_THROWS_WITH(lockstep::runtime::detail::gemm(false, true, 1, 1, 1, 1.0, &d, big + 5, &d, 1,
                                                    0.0, &d, 1),
                    Contains("lda = 2147483653"));
  // Output apart from the inputs: BLAS may clear C (beta = 0) before it reads
  // A and B, and does with OPENBLAS_CORETYPE=Haswell.
  float out = 7;
  lockstep::runtime::detail::gemm(false, false, 1, 1, 1, 2.0f, &one, 1, &one, 1, 0.0f, &out, 1);
  CHECK(out == 2.0f);
}
