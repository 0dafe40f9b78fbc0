// attention_from_qkv against what it replaces: qkv split into three heads
// views, scaled_dot_product_attention, the heads merged back. On the CPU the
// blocked kernel reads the packed layout in place, and must give the same
// bits, forward and backward, for every mask kind, causal and dropout; the
// composition it falls back to elsewhere; and argument errors.
#include <catch2/catch.hpp>

#include <limits>
#include <vector>

#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/ops/attention.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/misc.h"
#include "lockstep/runtime/ops/reduce.h"
#include "lockstep/runtime/random.h"
#include "lockstep/runtime/tensor.h"

using namespace lockstep::runtime;
using Catch::Contains;

namespace {

Tensor random(const Shape& shape, uint64_t seed, DType dtype) {
  Generator g(seed);
  return randn(shape, DType::f64, g).to(dtype);
}

Tensor composed(const Tensor& qkv, int64_t heads, const AttentionOptions& options) {
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3, hs = c / heads;
  const auto part = [&](int64_t i) {
    return qkv.slice(2, i * c, (i + 1) * c).reshape({b, t, heads, hs}).transpose(1, 2);
  };
  return scaled_dot_product_attention(part(0), part(1), part(2), options)
      .transpose(1, 2)
      .reshape({b, t, c});
}

struct Result {
  Tensor out, grad;
  std::string node;
};

// out and d(sum(out * weights))/d(qkv); dropout from a fresh Generator(seed).
template <class Attend>
Result run(Attend attend, const Tensor& values, const Tensor& weights, AttentionOptions options) {
  Tensor qkv = values.detach();
  qkv.requires_grad_(true);
  Generator gen(11);
  options.generator = &gen;
  Result r;
  r.out = attend(qkv, options);
  r.node = r.out.grad_fn() ? r.out.grad_fn()->name() : "";
  sum(r.out * weights).backward();
  r.grad = qkv.grad();
  return r;
}

std::vector<double> bits(const Tensor& t) { return t.to(DType::f64).to_vector<double>(); }

}  // namespace

TEST_CASE("attention_from_qkv: the same bits as split, attention and merge, forward and backward",
          "[runtime][ops][attention]") {
  struct Case {
    const char* name;
    int64_t b, t, c, heads;
    bool causal = false;
    int mask = 0;  // 0 none, 1 bool padding [B, 1, 1, T], 2 additive [T, T]
    double dropout = 0.0;
  };
  const std::vector<Case> cases = {
      {"plain", 2, 5, 24, 3},
      {"causal, several tiles", 2, 70, 24, 3, true},
      {"one head", 1, 9, 8, 1, true},
      {"padding mask", 2, 70, 24, 2, false, 1},
      {"additive mask", 2, 6, 12, 3, false, 2},
      {"dropout, causal", 2, 70, 24, 4, true, 0, 0.3},
  };
  for (DType dtype : {DType::f32, DType::f64}) {
    for (const Case& c : cases) {
      INFO(c.name << " in " << dtype_name(dtype));
      const Tensor values = random({c.b, c.t, 3 * c.c}, 1, dtype);
      const Tensor weights = random({c.b, c.t, c.c}, 2, dtype);
      AttentionOptions options{.causal = c.causal, .dropout = c.dropout};
      if (c.mask == 1) {
        std::vector<bool> keep;  // sample 1 sees only its first t - 3 keys
        for (int64_t n = 0; n < c.b; ++n)
          for (int64_t j = 0; j < c.t; ++j) keep.push_back(n == 0 || j < c.t - 3);
        Tensor m = Tensor::empty({c.b, 1, 1, c.t}, DType::boolean);
        for (size_t i = 0; i < keep.size(); ++i) m.data_ptr<bool>()[i] = keep[i];
        options.mask = m;
      } else if (c.mask == 2) {
        options.mask = random({c.t, c.t}, 3, dtype);
      }
      const Result packed = run(
          [&](const Tensor& x, const AttentionOptions& o) {
            return attention_from_qkv(x, c.heads, o);
          },
          values, weights, options);
      const Result reference = run(
          [&](const Tensor& x, const AttentionOptions& o) { return composed(x, c.heads, o); },
          values, weights, options);
      CHECK(packed.node == "AttentionFromQkvBackward");  // the kernel ran, not the composition
      CHECK(packed.out.shape() == Shape{c.b, c.t, c.c});
      CHECK(bits(packed.out) == bits(reference.out));
      CHECK(bits(packed.grad) == bits(reference.grad));
    }
  }
}

TEST_CASE("attention_from_qkv: bf16 and autocast take the composition; bad shapes are refused",
          "[runtime][ops][attention]") {
  const Tensor values = random({2, 7, 36}, 4, DType::f32);
  const Tensor weights = random({2, 7, 12}, 5, DType::f32);
  const auto packed = [](const Tensor& x, const AttentionOptions& o) {
    return attention_from_qkv(x, 3, o);
  };
  const auto reference = [](const Tensor& x, const AttentionOptions& o) {
    return composed(x, 3, o);
  };
  {
    const Result a = run(packed, values.to(DType::bf16), weights.to(DType::bf16), {.causal = true});
    const Result b =
        run(reference, values.to(DType::bf16), weights.to(DType::bf16), {.causal = true});
    CHECK(a.out.dtype() == DType::bf16);
    CHECK(bits(a.out) == bits(b.out));
    CHECK(bits(a.grad) == bits(b.grad));
  }
  {
    const auto scope = autocast({.dtype = DType::bf16});
    const Result a = run(packed, values, weights, {.causal = true});
    const Result b = run(reference, values, weights, {.causal = true});
    CHECK(a.out.dtype() == DType::bf16);
    CHECK(a.grad.dtype() == DType::f32);
    CHECK(bits(a.out) == bits(b.out));
    CHECK(bits(a.grad) == bits(b.grad));
  }
  CHECK_THROWS_WITH(attention_from_qkv(Tensor::zeros({2, 7, 36}), 5),
                    Contains("[2, 7, 36]") && Contains("num_heads = 5"));
  CHECK_THROWS_WITH(attention_from_qkv(Tensor::zeros({7, 36}), 3),
                    Contains("must be [B, T, 3C]"));
  CHECK_THROWS_WITH(attention_from_qkv(Tensor::zeros({2, 7, 0}), 3), Contains("positive"));
  CHECK_THROWS_WITH(attention_from_qkv(Tensor::zeros({2, 7, 36}), 3,
                                       {.mask = Tensor::zeros({5, 5})}),
                    Contains("does not broadcast"));
}

TEST_CASE("attention_from_qkv_composed refuses what attention_from_qkv refuses",
          "[runtime][ops][attention]") {
  // A last dim of 10 is not 3 * C: the composition took C = 3 and left the
  // last column out of q, k and v without a word; num_heads = 0 divided by 0.
  CHECK_THROWS_WITH(attention_from_qkv_composed(Tensor::zeros({1, 2, 10}), 1),
                    Contains("[1, 2, 10]") && Contains("3 * C"));
  CHECK_THROWS_WITH(attention_from_qkv_composed(Tensor::zeros({1, 2, 12}), 0),
                    Contains("num_heads = 0"));
  CHECK_THROWS_WITH(attention_from_qkv_composed(Tensor::zeros({2, 12}), 1),
                    Contains("must be [B, T, 3C]"));
  CHECK(attention_from_qkv_composed(Tensor::zeros({1, 2, 12}), 2).shape() == Shape{1, 2, 4});
}
