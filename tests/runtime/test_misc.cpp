// dropout, embedding and cat: values, gradients, error messages.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "lockstep/runtime/ops/misc.h"
#include "lockstep/runtime/ops/reduce.h"
#include "lockstep/runtime/random.h"
#include "support/gradcheck.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

TEST_CASE("dropout: same seed same mask, inverse scaling, mask mean", "[runtime][ops][misc]") {
  const DType dtype = GENERATE(DType::f32, DType::f64);
  const double p = GENERATE(0.1, 0.5, 0.8);
  INFO(dtype_name(dtype) << " p = " << p);
  Tensor x = Tensor::ones({100, 1000}, dtype);
  Generator g1(42), g2(42), g3(43);
  const auto a = dropout(x, p, true, g1).to_vector<double>();
  const auto b = dropout(x, p, true, g2).to_vector<double>();
  const auto c = dropout(x, p, true, g3).to_vector<double>();
  CHECK(a == b);
  CHECK(a != c);
  // Kept elements are 1 / (1 - p), dropped ones 0; the kept fraction is 1 - p
  // within five standard errors.
  const double scale = 1.0 / (1.0 - p);
  double kept = 0;
  bool values_ok = true;
  for (double v : a) {
    if (v != 0) kept += 1, values_ok = values_ok && std::abs(v - scale) < 1e-6 * scale;
  }
  CHECK(values_ok);
  const double n = static_cast<double>(a.size());
  CHECK(std::abs(kept / n - (1 - p)) < 5 * std::sqrt(p * (1 - p) / n));
  // The generator advanced: a second call gives another mask.
  CHECK(dropout(x, p, true, g1).to_vector<double>() != a);
}

TEST_CASE("dropout: identity cases, p = 1, bad p", "[runtime][ops][misc]") {
  Tensor x = Tensor::ones({3, 4});
  Generator g(1);
  CHECK(dropout(x, 0.0, true, g).is_same(x));
  CHECK(dropout(x, 0.7, false, g).is_same(x));
  CHECK(g.offset() == 0);  // identity draws nothing
  Tensor xr = random_input({3, 4}, 1);
  Tensor zero = dropout(xr, 1.0, true, g);
  for (double v : zero.to_vector<double>()) CHECK(v == 0.0);
  zero.backward(Tensor::ones({3, 4}, DType::f64));
  for (double v : xr.grad().to_vector<double>()) CHECK(v == 0.0);
  CHECK_THAT(error_of([&] { dropout(x, 1.5, true, g); }), Contains("p = 1.5 must be in [0, 1]"));
  CHECK_THAT(error_of([&] { dropout(x, -0.1, false, g); }), Contains("must be in [0, 1]"));
}

TEST_CASE("dropout gradient is mask / (1 - p)", "[runtime][ops][misc][gradcheck]") {
  Tensor x = random_input({8, 16}, 2);
  Generator g(9);
  Tensor y = dropout(x, 0.25, true, g);
  y.backward(Tensor::ones(y.shape(), DType::f64));
  const auto yv = y.to_vector<double>(), xv = x.to_vector<double>(), gv = x.grad().to_vector<double>();
  for (size_t i = 0; i < yv.size(); ++i) {
    const double mask = yv[i] == 0 ? 0.0 : 1.0;  // x is never exactly 0 here
    CHECK(gv[i] == Approx(mask / 0.75));
    CHECK(yv[i] == Approx(xv[i] * mask / 0.75));
  }
  // gradcheck with a fresh generator per call, so every evaluation uses the same mask.
  auto r = gradcheck(
      [](const std::vector<Tensor>& t) {
        Generator gen(5);
        return dropout(t[0], 0.4, true, gen);
      },
      {random_input({5, 7}, 3)});
  INFO(r.message);
  CHECK(r.ok);
}

TEST_CASE("embedding looks up rows and scatter-adds gradients", "[runtime][ops][misc]") {
  const DType index_type = GENERATE(DType::i64, DType::i32);
  Tensor w = Tensor::from_vector<double>({0, 1, 10, 11, 20, 21, 30, 31}, {4, 2}).requires_grad_();
  Tensor idx = Tensor::from_vector<int64_t>({3, 0, 3, 2, 1, 3}, {2, 3}).to(index_type);
  Tensor y = embedding(idx, w);
  CHECK(y.shape() == Shape{2, 3, 2});
  CHECK(y.to_vector<double>() ==
        std::vector<double>{30, 31, 0, 1, 30, 31, 20, 21, 10, 11, 30, 31});
  std::vector<double> gy(12);
  for (int i = 0; i < 12; ++i) gy[i] = i + 1;
  y.backward(Tensor::from_vector(gy, {2, 3, 2}));
  // Row 3 is used at positions 0, 2, 5: (1+5+11, 2+6+12).
  CHECK(w.grad().to_vector<double>() == std::vector<double>{3, 4, 9, 10, 7, 8, 17, 20});
}

TEST_CASE("embedding backward of bf16 and f16 weights adds rows in f32",
          "[runtime][ops][misc]") {
  const DType dt = GENERATE(DType::bf16, DType::f16);
  Tensor w = Tensor::zeros({3, 2}, dt).requires_grad_();
  // Row 1 is looked up 1000 times: 1000 in f32, rounded once (exact in both).
  Tensor idx = Tensor::ones({1000}, DType::i64);
  sum(embedding(idx, w)).backward();
  CHECK(w.grad().dtype() == dt);
  CHECK(w.grad().to_vector<float>() == std::vector<float>{0, 0, 1000, 1000, 0, 0});
}

TEST_CASE("embedding padding_idx row is looked up but gets no gradient",
          "[runtime][ops][misc]") {
  const DType index_type = GENERATE(DType::i64, DType::i32);
  const DType dt = GENERATE(DType::f64, DType::f32, DType::bf16);
  // -4 counts from the end of 5 rows: row 1, as PyTorch's padding_idx.
  const int64_t pad = GENERATE(1, -4);
  INFO(dtype_name(index_type) << " " << dtype_name(dt) << " padding_idx " << pad);
  Tensor w = Tensor::from_vector<double>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {5, 2})
                 .to(dt)
                 .requires_grad_();
  Tensor idx = Tensor::from_vector<int64_t>({1, 3, 1, 0}, {4}).to(index_type);
  Tensor y = embedding(idx, w, pad);
  CHECK(y.to_vector<double>() == std::vector<double>{2, 3, 6, 7, 2, 3, 0, 1});
  sum(y).backward();
  CHECK(w.grad().to_vector<double>() == std::vector<double>{1, 1, 0, 0, 0, 0, 1, 1, 0, 0});
}

TEST_CASE("embedding refuses a padding_idx outside the table", "[runtime][ops][misc]") {
  Tensor w = Tensor::zeros({5, 2});
  Tensor idx = Tensor::from_vector<int64_t>({1}, {1});
  CHECK_THAT(error_of([&] { embedding(idx, w, 5); }),
             Contains("padding_idx 5 is out of range for a table of 5 rows; give one in "
                      "[-5, 5)"));
  CHECK_THAT(error_of([&] { embedding(idx, w, -6); }), Contains("padding_idx -6"));
  CHECK(embedding(idx, w, -5).shape() == Shape{1, 2});
}

TEST_CASE("embedding gradcheck and errors", "[runtime][ops][misc][gradcheck]") {
  Tensor idx = Tensor::from_vector<int64_t>({1, 4, 1, 0, 2}, {5});
  auto r = gradcheck([&](const std::vector<Tensor>& t) { return embedding(idx, t[0]); },
                     {random_input({5, 3}, 4)});
  INFO(r.message);
  CHECK(r.ok);
  Tensor w = Tensor::zeros({5, 3});
  CHECK_THAT(error_of([&] { embedding(Tensor::from_vector<int64_t>({1, 5}, {2}), w); }),
             Contains("index 5 (at flat position 1) is out of range for a table of 5 rows"));
  CHECK_THAT(error_of([&] { embedding(Tensor::from_vector<int32_t>({-1}, {1}), w); }),
             Contains("index -1"));
  CHECK_THAT(error_of([&] { embedding(Tensor::zeros({2}), w); }),
             Contains("indices must be i64 or i32, got f32"));
  CHECK_THAT(error_of([&] { embedding(idx, Tensor::zeros({5})); }),
             Contains("expected weight [num_embeddings, dim], got [5]"));
}

TEST_CASE("cat along any dim, with gradients", "[runtime][ops][misc]") {
  const int64_t dim = GENERATE(0, 1, 2, -1);
  INFO("dim " << dim);
  Shape sa{2, 3, 4}, sb{2, 3, 4};
  const int64_t d = dim < 0 ? dim + 3 : dim;
  sb[d] = 1;
  std::vector<Tensor> in{random_input(sa, 1), random_input(sb, 2), random_input(sa, 3)};
  Tensor y = cat(in, dim);
  Shape want = sa;
  want[d] = 2 * sa[d] + 1;
  CHECK(y.shape() == want);
  // Element check against a slice of the output.
  CHECK(y.slice(d, 0, sa[d]).contiguous().to_vector<double>() == in[0].to_vector<double>());
  CHECK(y.slice(d, sa[d], sa[d] + 1).contiguous().to_vector<double>() ==
        in[1].to_vector<double>());
  CHECK(y.slice(d, sa[d] + 1, want[d]).contiguous().to_vector<double>() ==
        in[2].to_vector<double>());
  auto r = gradcheck([&](const std::vector<Tensor>& t) { return cat(t, dim); }, in);
  INFO(r.message);
  CHECK(r.ok);
}

TEST_CASE("cat: non-contiguous inputs, integer dtypes, shape errors", "[runtime][ops][misc]") {
  Tensor a = Tensor::from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor at = a.t();  // [3, 2], not contiguous: rows (1, 4), (2, 5), (3, 6)
  Tensor b = Tensor::from_vector<int64_t>({7, 8}, {1, 2});
  Tensor y = cat({at, b}, 0);
  CHECK(y.to_vector<int64_t>() == std::vector<int64_t>{1, 4, 2, 5, 3, 6, 7, 8});
  CHECK_THAT(error_of([&] { cat({a, Tensor::zeros({3, 3}).to(DType::i64)}, 1); }),
             Contains("tensor 1 has shape [3, 3] but tensor 0 has shape [2, 3]; all sizes must "
                      "match except in dim 1"));
  CHECK_THAT(error_of([&] { cat({a, Tensor::zeros({2, 3})}, 0); }),
             Contains("tensor 1 is f32 but tensor 0 is i64"));
  CHECK_THAT(error_of([&] { cat({a, Tensor::zeros({6}).to(DType::i64)}, 0); }),
             Contains("tensor 1 has shape [6]"));
  CHECK_THAT(error_of([] { cat({}, 0); }), Contains("expected at least one tensor"));
  CHECK_THAT(error_of([&] { cat({a}, 2); }), Contains("dim"));
}

TEST_CASE("cat leaves out 1-D tensors of no elements, as PyTorch", "[runtime][ops][misc]") {
  // The loop `acc = cat({acc, batch})` from an empty `acc`; before, every such cat was refused.
  Tensor a = random_input({2, 3}, 1), b = random_input({2, 2}, 2);
  const Tensor none = Tensor::zeros({0}, DType::f64);
  Tensor y = cat({none, a, none, b}, -1);
  CHECK(y.shape() == Shape{2, 5});
  CHECK(values(y.slice(1, 0, 3)) == values(a));
  CHECK(values(y.slice(1, 3, 5)) == values(b));
  CHECK(cat({none, none}, 0).shape() == Shape{0});
  CHECK_THAT(error_of([&] { cat({none, a, b}, 0); }),
             Contains("tensor 2 has shape [2, 2] but tensor 1 has shape [2, 3]"));

  // The left-out tensor's gradient has its own shape.
  Tensor e = Tensor::zeros({0}, DType::f64).requires_grad_();
  Tensor x = random_input({2, 3}, 3).requires_grad_();
  sum(cat({e, x}, 1)).backward();
  CHECK(e.grad().shape() == Shape{0});
  CHECK(values(x.grad()) == std::vector<double>(6, 1.0));
}
