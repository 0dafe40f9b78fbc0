// scaled_dot_product_attention: the blocked CPU kernel against a plain-loop
// reference in double and against the math path (forward and backward),
// finite differences, dropout's mask on both paths, rows with every key
// masked, and argument errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/ops/attention.h"
#include "lockstep/runtime/ops/misc.h"
#include "lockstep/runtime/random.h"
#include "lockstep/runtime/tensor.h"
#include "support/gradcheck.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Results are compared within this, relative and absolute. Outputs and
// gradients are O(1); in f32 the kernel and the math path round differently
// (sums over a few hundred keys in another order), by up to ~3e-6 here.
double tolerance(DType dt) { return dt == DType::f32 ? 1e-5 : 1e-10; }

enum class MaskKind { none, padding, additive };

struct Case {
  const char* name;
  Shape lead;
  int64_t l, s, e, ev;
  bool causal = false;
  MaskKind mask = MaskKind::none;
  std::optional<double> scale;
};

// Odd lengths (several 64-wide tiles and a partial one), L != S both ways,
// head dims 16..128, Ev != E, causal with L < S and L > S, both mask kinds.
const std::vector<Case> kCases = {
    {"one query, one key", {1, 1}, 1, 1, 16, 16},
    {"L = S = 7, causal, [2, 3] heads", {2, 3}, 7, 7, 32, 32, true},
    {"L = 65, S = 130, Ev < E, padding mask", {2, 2}, 65, 130, 64, 16, false, MaskKind::padding},
    {"L = 130, S = 65, causal, E = 128", {1, 2}, 130, 65, 128, 64, true},
    {"L = 65, S = 130, causal", {2}, 65, 130, 16, 16, true},
    {"no leading dims, additive mask, custom scale", {}, 130, 130, 16, 32, false,
     MaskKind::additive, 0.3},
    {"one head, L = 130, S = 7, E = 128, padding mask", {1, 1}, 130, 7, 128, 128, false,
     MaskKind::padding},
};

Shape with(const Shape& lead, int64_t a, int64_t b) {
  Shape s = lead;
  s.push_back(a);
  s.push_back(b);
  return s;
}

Tensor random(const Shape& shape, uint64_t seed, DType dtype) {
  Generator g(seed);
  return randn(shape, DType::f64, g).to(dtype);
}

struct Inputs {
  Tensor q, k, v, mask;
  std::vector<double> bias;  // [bh, l, s], added to the scaled scores (-inf: masked)
};

// q is a transposed view ([B, L, H, E] -> [B, H, L, E]) when there are two
// leading dims, as it comes out of a projection.
Inputs make_inputs(const Case& c, DType dtype) {
  Inputs in;
  if (c.lead.size() == 2) {
    in.q = random({c.lead[0], c.l, c.lead[1], c.e}, 1, dtype).transpose(1, 2);
  } else {
    in.q = random(with(c.lead, c.l, c.e), 1, dtype);
  }
  in.k = random(with(c.lead, c.s, c.e), 2, dtype);
  in.v = random(with(c.lead, c.s, c.ev), 3, dtype);
  const int64_t bh = shape_numel(c.lead);
  in.bias.assign(bh * c.l * c.s, 0.0);
  auto bias = [&](int64_t b, int64_t i, int64_t j) -> double& {
    return in.bias[(b * c.l + i) * c.s + j];
  };
  if (c.causal) {
    for (int64_t b = 0; b < bh; ++b)
      for (int64_t i = 0; i < c.l; ++i)
        for (int64_t j = i + 1; j < c.s; ++j) bias(b, i, j) = -kInf;
  }
  if (c.mask == MaskKind::padding) {
    // [B, 1, 1, S]: batch n sees its first s - 3n - 1 keys.
    const int64_t batches = c.lead[0], heads = c.lead[1];
    std::vector<uint8_t> keep(batches * c.s);
    for (int64_t n = 0; n < batches; ++n)
      for (int64_t j = 0; j < c.s; ++j) keep[n * c.s + j] = j < c.s - 3 * n - 1;
    in.mask = Tensor::from_vector(keep, {batches, 1, 1, c.s}).to(DType::boolean);
    for (int64_t b = 0; b < bh; ++b)
      for (int64_t i = 0; i < c.l; ++i)
        for (int64_t j = 0; j < c.s; ++j)
          if (!keep[(b / heads) * c.s + j]) bias(b, i, j) = -kInf;
  }
  if (c.mask == MaskKind::additive) {
    // [L, S]: values in [-2, 0], and -inf on a fifth of the keys of every
    // row; a transposed view, so that neither of its strides is 1 element.
    std::vector<double> m = values(random({c.l, c.s}, 4, DType::f64));
    std::vector<double> m_t(m.size());
    for (int64_t i = 0; i < c.l; ++i)
      for (int64_t j = 0; j < c.s; ++j) {
        double& x = m[i * c.s + j];
        x = (i + 2 * j) % 5 == 0 ? -kInf : -std::abs(x);
        m_t[j * c.l + i] = x;
      }
    in.mask = Tensor::from_vector(m_t, {c.s, c.l}).to(dtype).t();
    for (int64_t b = 0; b < bh; ++b)
      for (int64_t i = 0; i < c.l; ++i)
        for (int64_t j = 0; j < c.s; ++j) bias(b, i, j) = m[i * c.s + j];
  }
  return in;
}

AttentionOptions options_of(const Case& c, const Inputs& in) {
  return {.mask = in.mask, .causal = c.causal, .scale = c.scale};
}

// out [bh, l, ev] in double: the full score matrix, softmax, weighted sum. A
// row with every key masked gives 0.
std::vector<double> reference(const Case& c, const Inputs& in) {
  const int64_t bh = shape_numel(c.lead);
  const double scale = c.scale.value_or(1.0 / std::sqrt(static_cast<double>(c.e)));
  const std::vector<double> q = values(in.q), k = values(in.k), v = values(in.v);
  std::vector<double> out(bh * c.l * c.ev, 0.0), w(c.s);
  for (int64_t b = 0; b < bh; ++b)
    for (int64_t i = 0; i < c.l; ++i) {
      double mx = -kInf;
      for (int64_t j = 0; j < c.s; ++j) {
        double dot = 0;
        for (int64_t x = 0; x < c.e; ++x)
          dot += q[(b * c.l + i) * c.e + x] * k[(b * c.s + j) * c.e + x];
        w[j] = scale * dot + in.bias[(b * c.l + i) * c.s + j];
        mx = std::max(mx, w[j]);
      }
      if (mx == -kInf) continue;
      double z = 0;
      for (int64_t j = 0; j < c.s; ++j) z += (w[j] = std::exp(w[j] - mx));
      for (int64_t j = 0; j < c.s; ++j)
        for (int64_t x = 0; x < c.ev; ++x)
          out[(b * c.l + i) * c.ev + x] += w[j] / z * v[(b * c.s + j) * c.ev + x];
    }
  return out;
}

using Attention = Tensor (*)(const Tensor&, const Tensor&, const Tensor&,
                             const AttentionOptions&);
constexpr Attention kBlocked = &scaled_dot_product_attention;
constexpr Attention kMath = &scaled_dot_product_attention_math;

struct Result {
  Tensor out, dq, dk, dv;
};

// The output and, when `grad_out` is given, the gradients of q, k and v (as
// fresh leaves; only those named in `wants` require grad).
Result run(Attention attention, const Inputs& in, const AttentionOptions& o,
           const Tensor& grad_out = {}, std::vector<bool> wants = {true, true, true}) {
  std::vector<Tensor> x = {in.q.detach(), in.k.detach(), in.v.detach()};
  if (grad_out.defined())
    for (int i = 0; i < 3; ++i)
      if (wants[i]) x[i].requires_grad_();
  Result r{attention(x[0], x[1], x[2], o), {}, {}, {}};
  if (!grad_out.defined()) return r;
  r.out.backward(grad_out);
  r.dq = x[0].grad(), r.dk = x[1].grad(), r.dv = x[2].grad();
  return r;
}

// One CHECK per tensor (not per element: the test stays fast under
// sanitizers), naming the worst element.
void check_close_all(const Tensor& t, const std::vector<double>& expected, double tol) {
  REQUIRE(t.defined());
  const std::vector<double> got = values(t);
  REQUIRE(got.size() == expected.size());
  size_t worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double excess = std::abs(got[i] - expected[i]) - tol * (1 + std::abs(expected[i]));
    if (!(excess <= worst_excess)) worst = i, worst_excess = excess;  // NaN counts as worst
  }
  INFO("element " << worst << " of " << got.size() << ": " << (got.empty() ? 0 : got[worst])
                  << ", expected " << (got.empty() ? 0 : expected[worst]) << " within " << tol);
  CHECK((got.empty() || worst_excess <= 0));
}

void check_near(const Tensor& t, const Tensor& expected, double tol) {
  REQUIRE(t.defined());
  REQUIRE(t.shape() == expected.shape());
  check_close_all(t, values(expected), tol);
}

bool all_finite(const Tensor& t) {
  for (double x : values(t))
    if (!std::isfinite(x)) return false;
  return true;
}

}  // namespace

TEST_CASE("attention forward: blocked kernel against a plain reference and the math path",
          "[runtime][ops][attention]") {
  const DType dt = GENERATE(DType::f32, DType::f64);
  for (const Case& c : kCases) {
    INFO(c.name << ", " << dtype_name(dt));
    const Inputs in = make_inputs(c, dt);
    const AttentionOptions o = options_of(c, in);
    const Tensor blocked = scaled_dot_product_attention(in.q, in.k, in.v, o);
    CHECK(blocked.shape() == with(c.lead, c.l, c.ev));
    CHECK(blocked.dtype() == dt);
    check_close_all(blocked, reference(c, in), tolerance(dt));
    check_near(scaled_dot_product_attention_math(in.q, in.k, in.v, o), blocked, tolerance(dt));
  }
}

TEST_CASE("attention backward: the blocked kernel's gradients match the math path's",
          "[runtime][ops][attention]") {
  const DType dt = GENERATE(DType::f32, DType::f64);
  for (const Case& c : kCases) {
    INFO(c.name << ", " << dtype_name(dt));
    const Inputs in = make_inputs(c, dt);
    const AttentionOptions o = options_of(c, in);
    const Tensor grad_out = random(with(c.lead, c.l, c.ev), 5, dt);
    const Result blocked = run(kBlocked, in, o, grad_out);
    const Result math = run(kMath, in, o, grad_out);
    REQUIRE(blocked.out.grad_fn());
    CHECK(blocked.out.grad_fn()->name() == "ScaledDotProductAttentionBackward");
    check_near(blocked.dq, math.dq, tolerance(dt));
    check_near(blocked.dk, math.dk, tolerance(dt));
    check_near(blocked.dv, math.dv, tolerance(dt));
  }
}

TEST_CASE("attention backward: only the inputs that require grad get one",
          "[runtime][ops][attention]") {
  const Case c{"k only", {2}, 9, 70, 8, 4, true};
  const Inputs in = make_inputs(c, DType::f64);
  const Tensor grad_out = random(with(c.lead, c.l, c.ev), 5, DType::f64);
  for (const std::vector<bool>& wants : {std::vector<bool>{false, true, false},
                                         std::vector<bool>{false, false, true},
                                         std::vector<bool>{true, false, false}}) {
    const Result blocked = run(kBlocked, in, options_of(c, in), grad_out, wants);
    const Result math = run(kMath, in, options_of(c, in), grad_out, wants);
    const Tensor* got[] = {&blocked.dq, &blocked.dk, &blocked.dv};
    const Tensor* want[] = {&math.dq, &math.dk, &math.dv};
    for (int i = 0; i < 3; ++i) {
      INFO("input " << i);
      CHECK(got[i]->defined() == wants[i]);
      if (wants[i]) check_near(*got[i], *want[i], 1e-10);
    }
  }
}

TEST_CASE("attention gradients: finite differences in f64", "[runtime][ops][attention]") {
  auto attention = [](AttentionOptions o) {
    return [o](const std::vector<Tensor>& x) {
      AttentionOptions local = o;
      Generator g(7);  // the same dropout mask at every evaluation
      local.generator = &g;
      return scaled_dot_product_attention(x[0], x[1], x[2], local);
    };
  };
  SECTION("causal, L < S") {
    check_grad("causal", attention({.causal = true}),
               {random_input({1, 2, 5, 3}, 1), random_input({1, 2, 6, 3}, 2),
                random_input({1, 2, 6, 4}, 3)});
  }
  SECTION("bool mask with a fully masked row, and an additive mask") {
    std::vector<uint8_t> keep(5 * 6);
    for (int64_t i = 0; i < 5; ++i)
      for (int64_t j = 0; j < 6; ++j) keep[i * 6 + j] = i != 2 && (i + j) % 3 != 0;
    const Tensor mask = Tensor::from_vector(keep, {5, 6}).to(DType::boolean);
    const std::vector<Tensor> x = {random_input({2, 5, 3}, 1), random_input({2, 6, 3}, 2),
                                   random_input({2, 6, 4}, 3)};
    check_grad("bool mask", attention({.mask = mask}), x);
    const Tensor bias = random_input({2, 1, 6}, 4).detach();
    check_grad("additive mask", attention({.mask = bias, .scale = 0.7}), x);
  }
  SECTION("several tiles, causal, with dropout") {
    check_grad("tiles", attention({.causal = true, .dropout = 0.2}),
               {random_input({1, 67, 2}, 1), random_input({1, 70, 2}, 2),
                random_input({1, 70, 2}, 3)});
  }
}

TEST_CASE("attention dropout: both paths and dropout() drop the same weights",
          "[runtime][ops][attention]") {
  // q = 0 makes every weight 1/S; v = identity makes out[.., i, j] the weight
  // of (i, j) after dropout: 0 if dropped, 1 / (S (1 - p)) if kept.
  const int64_t heads = 6, l = 50, s = 40;
  const double p = 0.25;
  const Tensor q = Tensor::zeros({2, 3, l, 8});
  const Tensor k = random({2, 3, s, 8}, 2, DType::f32);
  Tensor eye = Tensor::zeros({s, s});
  for (int64_t j = 0; j < s; ++j) eye.data_ptr<float>()[j * s + j] = 1;
  const Tensor v = eye.expand({2, 3, s, s});
  auto kept = [&](Attention attention, Generator& g) {
    const std::vector<double> out = values(attention(q, k, v, {.dropout = p, .generator = &g}));
    const double weight = 1.0 / (s * (1 - p));
    std::vector<bool> mask;
    bool zero_or_kept = true;
    for (double x : out) {
      zero_or_kept = zero_or_kept && (x == 0.0 || std::abs(x - weight) <= 1e-6 * weight);
      mask.push_back(x != 0.0);
    }
    CHECK(zero_or_kept);
    return mask;
  };
  Generator g1(42), g2(42), g3(42);
  const std::vector<bool> blocked = kept(kBlocked, g1);
  CHECK(blocked == kept(kMath, g2));
  CHECK(g1.offset() == static_cast<uint64_t>(heads * l * s));
  CHECK(g2.offset() == g1.offset());
  const std::vector<double> direct = values(dropout(Tensor::ones({heads, l, s}), p, true, g3));
  std::vector<bool> from_dropout;
  for (double x : direct) from_dropout.push_back(x != 0.0);
  CHECK(blocked == from_dropout);
  int64_t dropped = 0;
  for (bool keep : blocked) dropped += !keep;
  // 12000 weights: the fraction's standard deviation is 0.004.
  CHECK(static_cast<double>(dropped) / static_cast<double>(blocked.size()) ==
        Approx(p).margin(0.02));
  // The next call draws new positions.
  CHECK(kept(kBlocked, g1) != blocked);
}

TEST_CASE("attention dropout: forward and backward match the math path",
          "[runtime][ops][attention]") {
  const DType dt = GENERATE(DType::f32, DType::f64);
  const Case c{"dropout", {2, 2}, 65, 70, 16, 8, false, MaskKind::padding};
  const Inputs in = make_inputs(c, dt);
  const Tensor grad_out = random(with(c.lead, c.l, c.ev), 5, dt);
  for (const bool causal : {false, true}) {
    INFO("causal " << causal << ", " << dtype_name(dt));
    Generator g1(9), g2(9);
    const Tensor mask = causal ? Tensor() : in.mask;
    const Result blocked = run(kBlocked, in, {.mask = mask, .causal = causal, .dropout = 0.3,
                                              .generator = &g1}, grad_out);
    const Result math = run(kMath, in, {.mask = mask, .causal = causal, .dropout = 0.3,
                                        .generator = &g2}, grad_out);
    check_near(blocked.out, math.out, tolerance(dt));
    check_near(blocked.dq, math.dq, tolerance(dt));
    check_near(blocked.dk, math.dk, tolerance(dt));
    check_near(blocked.dv, math.dv, tolerance(dt));
  }
  SECTION("the default generator when none is given") {
    manual_seed(3);
    const Tensor blocked = scaled_dot_product_attention(in.q, in.k, in.v, {.dropout = 0.5});
    CHECK(default_generator().offset() == static_cast<uint64_t>(4 * c.l * c.s));
    manual_seed(3);
    check_near(scaled_dot_product_attention_math(in.q, in.k, in.v, {.dropout = 0.5}), blocked,
               tolerance(dt));
  }
}

TEST_CASE("attention: a row with every key masked gives zeros and zero gradients",
          "[runtime][ops][attention]") {
  // [2, 1, 9, 70], as transposed views: rows 0 and 4 of batch 0 and row 8
  // of batch 1 see no key (70 keys: the row is masked across two key tiles).
  const int64_t l = 9, s = 70;
  auto dead = [](int64_t n, int64_t i) {
    return (n == 0 && (i == 0 || i == 4)) || (n == 1 && i == 8);
  };
  std::vector<uint8_t> keep(2 * l * s);
  std::vector<double> bias(2 * l * s);
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t i = 0; i < l; ++i)
      for (int64_t j = 0; j < s; ++j) {
        const size_t at = (n * s + j) * l + i;
        keep[at] = !dead(n, i) && (i * 7 + j) % 4 != 0;
        bias[at] = keep[at] ? 0.1 * static_cast<double>(j % 3) : -kInf;
      }
  const Tensor bool_mask =
      Tensor::from_vector(keep, {2, 1, s, l}).to(DType::boolean).transpose(2, 3);
  const Tensor float_mask =
      Tensor::from_vector(bias, {2, 1, s, l}).to(DType::f32).transpose(2, 3);
  const Case c{"dead rows", {2, 3}, l, s, 16, 8};
  const Inputs in = make_inputs(c, DType::f32);
  const Tensor grad_out = random(with(c.lead, l, c.ev), 5, DType::f32);
  for (const Tensor& mask : {bool_mask, float_mask}) {
    INFO("mask " << dtype_name(mask.dtype()));
    for (Attention attention : {kBlocked, kMath}) {
      INFO((attention == kBlocked ? "blocked" : "math"));
      const Result r = run(attention, in, {.mask = mask}, grad_out);
      for (int64_t n = 0; n < 2; ++n)
        for (int64_t h = 0; h < 3; ++h)
          for (int64_t i = 0; i < l; ++i) {
            if (!dead(n, i)) continue;
            INFO("batch " << n << " row " << i);
            const auto row = [&](const Tensor& t) {
              return values(t.select(0, n).select(0, h).select(0, i));
            };
            CHECK(row(r.out) == std::vector<double>(c.ev, 0.0));
            CHECK(row(r.dq) == std::vector<double>(c.e, 0.0));
          }
      CHECK(all_finite(r.out));
      CHECK(all_finite(r.dq));
      CHECK(all_finite(r.dk));
      CHECK(all_finite(r.dv));
    }
    const Result blocked = run(kBlocked, in, {.mask = mask}, grad_out);
    const Result math = run(kMath, in, {.mask = mask}, grad_out);
    check_near(blocked.out, math.out, tolerance(DType::f32));
    check_near(blocked.dk, math.dk, tolerance(DType::f32));
    check_near(blocked.dv, math.dv, tolerance(DType::f32));
  }
}

TEST_CASE("attention: a NaN query or key makes the rows that see it NaN, on both paths",
          "[runtime][ops][attention]") {
  // Causal, 70 keys (two key tiles): a NaN in query 3 reaches row 3 only; a
  // NaN in key 66 (the second tile) reaches rows 66..69, whose first tile is
  // finite. A NaN never reads as a masked key (a row of zeros). The math path
  // adds the causal mask to the scores, as PyTorch's does, so there a masked
  // NaN key reaches the rows before it too (NaN + -inf is NaN).
  const Case c{"NaN", {1, 1}, 70, 70, 16, 8, true};
  for (const bool in_key : {false, true}) {
    INFO((in_key ? "NaN key 66" : "NaN query 3"));
    Inputs in = make_inputs(c, DType::f32);
    Tensor& t = in_key ? in.k : in.q;
    t = t.contiguous();
    t.select(0, 0).select(0, 0).select(0, in_key ? 66 : 3).select(0, 5).fill_(std::nan(""));
    for (Attention attention : {kBlocked, kMath}) {
      INFO((attention == kBlocked ? "blocked" : "math"));
      const Tensor out = attention(in.q, in.k, in.v, {.causal = true});
      for (int64_t i = 0; i < c.l; ++i) {
        INFO("row " << i);
        const bool sees_nan = in_key ? i >= 66 : i == 3;
        const std::vector<double> row = values(out.select(0, 0).select(0, 0).select(0, i));
        if (attention == kBlocked || !in_key)
          CHECK(std::isnan(row[0]) == sees_nan);
        else
          CHECK(std::isnan(row[0]));
      }
    }
  }
}

TEST_CASE("attention: masks of every rank broadcast", "[runtime][ops][attention]") {
  const Case c{"ranks", {2, 3}, 5, 9, 4, 3};
  const Inputs in = make_inputs(c, DType::f64);
  std::vector<uint8_t> keep(9);
  for (int64_t j = 0; j < 9; ++j) keep[j] = j % 4 != 1;
  const Tensor key_mask = Tensor::from_vector(keep, {9}).to(DType::boolean);
  const Tensor full = key_mask.expand({2, 3, 5, 9}).contiguous();
  const Tensor want = scaled_dot_product_attention_math(in.q, in.k, in.v, {.mask = full});
  for (const Tensor& mask : {key_mask, key_mask.reshape({1, 9}), key_mask.reshape({1, 1, 1, 9})}) {
    INFO("mask " << shape_str(mask.shape()));
    for (Attention attention : {kBlocked, kMath})
      check_near(attention(in.q, in.k, in.v, {.mask = mask}), want, 1e-12);
  }
  const Tensor scalar_mask = Tensor::from_vector(std::vector<double>{-0.5}, {});
  check_near(scaled_dot_product_attention(in.q, in.k, in.v, {.mask = scalar_mask}),
             scaled_dot_product_attention(in.q, in.k, in.v), 1e-12);
}

TEST_CASE("attention: no keys, no queries", "[runtime][ops][attention]") {
  const Tensor q = random({2, 5, 4}, 1, DType::f32), k = Tensor::zeros({2, 0, 4}),
               v = Tensor::zeros({2, 0, 3});
  for (Attention attention : {kBlocked, kMath}) {
    const Tensor out = attention(q, k, v, {});
    CHECK(out.shape() == Shape{2, 5, 3});
    CHECK(values(out) == std::vector<double>(30, 0.0));
    CHECK(attention(Tensor::zeros({2, 0, 4}), q, q, {}).shape() == Shape{2, 0, 4});
  }
}

TEST_CASE("attention: bad arguments are refused with a clear message",
          "[runtime][ops][attention]") {
  const Tensor q = Tensor::zeros({2, 4, 8}), k = Tensor::zeros({2, 5, 8}),
               v = Tensor::zeros({2, 5, 6});
  for (Attention attention : {kBlocked, kMath}) {
    auto error = [&](const Tensor& q2, const Tensor& k2, const Tensor& v2,
                     const AttentionOptions& o = {}) {
      return error_of([&] { attention(q2, k2, v2, o); });
    };
    CHECK_THAT(error(q, k, v, {.mask = Tensor::ones({4, 5}, DType::boolean), .causal = true}),
               Contains("causal and mask cannot be combined") && Contains("into the mask"));
    CHECK_THAT(error(q, Tensor::zeros({2, 5, 7}), v), Contains("same head dim E"));
    CHECK_THAT(error(q, k, Tensor::zeros({2, 6, 6})), Contains("same number of keys S"));
    CHECK_THAT(error(q, Tensor::zeros({3, 5, 8}), Tensor::zeros({3, 5, 6})),
               Contains("leading (batch, head) dims differ"));
    CHECK_THAT(error(q, k.unsqueeze(0), v), Contains("same number of dims"));
    CHECK_THAT(error(Tensor::zeros({8}), Tensor::zeros({8}), Tensor::zeros({8})),
               Contains("at least 2"));
    CHECK_THAT(error(q, k, v, {.dropout = -0.1}), Contains("dropout = -0.1 must be in [0, 1)"));
    CHECK_THAT(error(q, k, v, {.dropout = 1.0}), Contains("must be in [0, 1)"));
    CHECK_THAT(error(q, k, v, {.mask = Tensor::ones({3, 5}, DType::boolean)}),
               Contains("does not broadcast") && Contains("[2, 4, 5]"));
    CHECK_THAT(error(q, k, v, {.mask = Tensor::ones({4, 5}, DType::i64)}),
               Contains("must be bool") && Contains("i64"));
    CHECK_THAT(error(q, k, v, {.mask = Tensor::zeros({4, 5}, DType::f64)}),
               Contains("additive in q's dtype f32"));
    CHECK_THAT(error(q, k.to(DType::f64), v), Contains("one dtype"));
    CHECK_THAT(error(q.to(DType::i32), k.to(DType::i32), v.to(DType::i32)),
               Contains("must be floating"));
    CHECK_THAT(error(Tensor::zeros({2, 4, 0}), Tensor::zeros({2, 5, 0}), v),
               Contains("at least 1"));
    CHECK_THAT(error(q, k, Tensor(), {}), Contains("v is undefined"));
    // A learned bias would never train: refused, unless grad mode is off.
    const Tensor bias = Tensor::zeros({4, 5}).requires_grad_();
    CHECK_THAT(error(q, k, v, {.mask = bias}),
               Contains("the mask requires grad") && Contains("mask.detach()"));
    {
      NoGradGuard no_grad;
      CHECK_NOTHROW(attention(q, k, v, {.mask = bias}));
    }
    CHECK_NOTHROW(attention(q, k, v, {.mask = bias.detach()}));
  }
  CHECK_THAT(error_of([&] {
               scaled_dot_product_attention(q.to(DType::bf16), k.to(DType::f32),
                                            v.to(DType::bf16));
             }),
             Contains("bf16") && Contains("f32"));
}

TEST_CASE("attention backward: a row masked by a large finite bias gets the math path's weights",
          "[runtime][ops][attention]") {
  // An additive mask of -1e9 (finite, as padding masks are often written)
  // over every key of every third row: those rows' weights are uniform, but
  // in f32 their log-sum-exp m + log(l) rounds to m, so weights recomputed
  // from it would all be 1, not 1 / S.
  const Case c{"far rows", {2, 2}, 9, 70, 16, 8};
  const DType dt = DType::f32;
  const Inputs in = make_inputs(c, dt);
  std::vector<double> bias(c.l * c.s);
  for (int64_t i = 0; i < c.l; ++i)
    for (int64_t j = 0; j < c.s; ++j)
      bias[i * c.s + j] = i % 3 == 0 ? -1e9 : 0.1 * static_cast<double>(j % 4);
  const Tensor mask = Tensor::from_vector(bias, {c.l, c.s}).to(dt);
  const Tensor grad_out = random(with(c.lead, c.l, c.ev), 5, dt);
  const Result blocked = run(kBlocked, in, {.mask = mask}, grad_out);
  const Result math = run(kMath, in, {.mask = mask}, grad_out);
  check_near(blocked.out, math.out, tolerance(dt));
  check_near(blocked.dq, math.dq, tolerance(dt));
  check_near(blocked.dk, math.dk, tolerance(dt));
  check_near(blocked.dv, math.dv, tolerance(dt));
}
