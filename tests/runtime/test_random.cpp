// The counter-based generator (Philox4x32-10): golden values, reproducibility,
// offsets, block boundaries; the distributions and initialisers built on it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "lockstep/runtime/random.h"
#include "lockstep/runtime/tensor.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

namespace {

/*
 * An independent, straightforward Philox4x32-10 written from the paper
 * (Salmon et al., SC'11): per round, with multipliers M0, M1,
 *   (hi0, lo0) = M0 * c0,  (hi1, lo1) = M1 * c2
 *   c = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)
 * and the key bumped by the Weyl constants W0, W1 between rounds. Generator
 * uses counter = (block index low, high, 0, 0) and key = (seed low, high).
 */
using Words = std::array<uint32_t, 4>;

Words philox_reference(Words c, std::array<uint32_t, 2> k) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
  constexpr uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k[0] += W0;
      k[1] += W1;
    }
    const uint64_t p0 = uint64_t{M0} * c[0];
    const uint64_t p1 = uint64_t{M1} * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
  }
  return c;
}

// Draw i of the stream for `seed`, from the reference.
uint32_t reference_draw(uint64_t seed, uint64_t i) {
  const uint64_t block = i / 4;
  Words w = philox_reference(
      {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0, 0},
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  return w[i % 4];
}

std::vector<uint32_t> draws(Generator& g, size_t n) {
  std::vector<uint32_t> v(n);
  g.fill_u32(v.data(), n);
  return v;
}

struct Moments {
  double mean, std, min, max;
};

Moments moments(const Tensor& t) {
  auto v = values(t);
  Moments m{0, 0, v[0], v[0]};
  for (double x : v) {
    m.mean += x;
    m.min = std::min(m.min, x);
    m.max = std::max(m.max, x);
  }
  m.mean /= static_cast<double>(v.size());
  for (double x : v) m.std += (x - m.mean) * (x - m.mean);
  m.std = std::sqrt(m.std / static_cast<double>(v.size()));
  return m;
}

}  // namespace

TEST_CASE("the reference Philox matches the published known-answer vectors",
          "[runtime][random]") {
  // From the Random123 distribution's kat_vectors (philox4x32, 10 rounds).
  CHECK(philox_reference({0, 0, 0, 0}, {0, 0}) ==
        Words{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(philox_reference({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
                         {0xffffffff, 0xffffffff}) ==
        Words{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(philox_reference({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
                         {0xa4093822, 0x299f31d0}) ==
        Words{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("golden values: the stream for fixed seeds never changes", "[runtime][random]") {
  Generator g0(0);
  CHECK(draws(g0, 8) == std::vector<uint32_t>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8,
                                              0xf8e4cca4, 0x5cb200db, 0xb1a574eb, 0x097eff67});
  Generator g42(42);
  CHECK(draws(g42, 4) == std::vector<uint32_t>{0x9ceaf053, 0x77f5493b, 0x12bf50ad, 0x5742b3d7});
  // A seed with both 32-bit halves non-zero (the key uses all 64 bits).
  Generator gbig(0x0123456789abcdefull);
  CHECK(draws(gbig, 8) == std::vector<uint32_t>{0xb850222e, 0xc58cb04b, 0x14a7a020, 0x7a84fff9,
                                                0xadca1466, 0x523e0d85, 0x65401425, 0xb299da3f});
}

TEST_CASE("the generator agrees with the reference at any position", "[runtime][random]") {
  const uint64_t seed = GENERATE(uint64_t{0}, uint64_t{1}, uint64_t{12345},
                                 uint64_t{0xffffffffffffffffull}, uint64_t{1ull << 32});
  Generator g(seed);
  auto v = draws(g, 37);
  for (uint64_t i = 0; i < v.size(); ++i) {
    INFO("seed " << seed << " draw " << i);
    CHECK(v[i] == reference_draw(seed, i));
  }
  // Far into the stream, where the block index needs its high word.
  const uint64_t far = (1ull << 34) + 6;
  g.set_offset(far);
  CHECK(g.next_u32() == reference_draw(seed, far));
  CHECK(g.next_u32() == reference_draw(seed, far + 1));
  CHECK(g.offset() == far + 2);
}

TEST_CASE("same seed, same values; different seeds, different values", "[runtime][random]") {
  Generator a(7), b(7), c(8);
  auto va = draws(a, 100), vb = draws(b, 100), vc = draws(c, 100);
  CHECK(va == vb);
  CHECK(va != vc);
  Generator d(7), e(7);
  CHECK(values(rand({50}, DType::f32, d)) == values(rand({50}, DType::f32, e)));
  CHECK(values(randn({7, 3}, DType::f64, d)) == values(randn({7, 3}, DType::f64, e)));
  CHECK(d.offset() == e.offset());
  CHECK(d.seed() == 7);
}

TEST_CASE("offsets: save and restore resumes the same stream", "[runtime][random]") {
  Generator g(99);
  draws(g, 5);
  CHECK(g.offset() == 5);
  const uint64_t saved = g.offset();
  auto first = draws(g, 13);
  Tensor t1 = rand({9}, DType::f64, g);
  CHECK(g.offset() == saved + 13 + 18);  // next_uniform uses two draws
  g.set_offset(saved);
  CHECK(draws(g, 13) == first);
  CHECK(values(rand({9}, DType::f64, g)) == values(t1));

  // A fresh generator moved to the same position gives the same values.
  Generator h(99);
  h.set_offset(saved);
  CHECK(draws(h, 13) == first);

  // manual_seed starts over.
  g.manual_seed(99);
  CHECK(g.offset() == 0);
  Generator fresh(99);
  CHECK(draws(g, 6) == draws(fresh, 6));
  g.manual_seed(100);
  CHECK(g.seed() == 100);
  Generator fresh100(100);
  CHECK(draws(g, 4) == draws(fresh100, 4));
}

TEST_CASE("fill_u32 across block boundaries equals one-by-one draws", "[runtime][random]") {
  const uint64_t start = GENERATE(0, 1, 2, 3, 4, 5, 7);
  const size_t n = GENERATE(0, 1, 3, 4, 5, 9, 16, 33);
  INFO("start " << start << ", n " << n);
  Generator bulk(2024), single(2024);
  bulk.set_offset(start);
  single.set_offset(start);
  auto v = draws(bulk, n);
  std::vector<uint32_t> w;
  for (size_t i = 0; i < n; ++i) w.push_back(single.next_u32());
  CHECK(v == w);
  CHECK(bulk.offset() == start + n);
  CHECK(single.offset() == start + n);
  // Chunked fills of odd sizes give the same stream as one fill.
  Generator chunked(2024), whole(2024);
  std::vector<uint32_t> parts;
  for (size_t k : {1, 2, 3, 5, 7}) {
    auto p = draws(chunked, k);
    parts.insert(parts.end(), p.begin(), p.end());
  }
  CHECK(parts == draws(whole, 18));
}

TEST_CASE("next_uniform is in [0, 1) and uses two draws", "[runtime][random]") {
  Generator g(5);
  double lo = 1, hi = 0;
  for (int i = 0; i < 10000; ++i) {
    double u = g.next_uniform();
    lo = std::min(lo, u);
    hi = std::max(hi, u);
  }
  CHECK(lo >= 0.0);
  CHECK(hi < 1.0);
  CHECK(lo < 0.001);
  CHECK(hi > 0.999);
  CHECK(g.offset() == 20000);
}

TEST_CASE("uniform_: in range, mean about the middle", "[runtime][random]") {
  const DType dt = GENERATE(DType::f32, DType::f64);
  Generator g(1);
  Tensor t = rand({100000}, dt, g);
  CHECK(t.dtype() == dt);
  CHECK(t.shape() == Shape{100000});
  Moments m = moments(t);
  CHECK(m.min >= 0.0);
  CHECK(m.max <= 1.0);
  if (dt == DType::f64) CHECK(m.max < 1.0);
  // The standard error of the mean is 0.29 / sqrt(1e5) ~ 0.001.
  CHECK(std::abs(m.mean - 0.5) < 0.01);
  CHECK(std::abs(m.std - std::sqrt(1.0 / 12)) < 0.01);

  Tensor u = Tensor::empty({100000}, dt);
  uniform_(u, -3.0, 5.0, g);
  Moments mu = moments(u);
  CHECK(mu.min >= -3.0);
  CHECK(mu.max <= 5.0);
  CHECK(mu.min < -2.99);
  CHECK(mu.max > 4.99);
  CHECK(std::abs(mu.mean - 1.0) < 0.05);
}

TEST_CASE("uniform_ stays below hi where a draw rounds up to it in f32", "[runtime][random]") {
  // At this position next_uniform() is within 2^-25 of 1: rounded to f32 it
  // was 1.0, outside rand()'s [0, 1).
  Generator g(2);
  g.set_offset(58491162);
  CHECK(Generator(g).next_uniform() < 1.0);
  CHECK(static_cast<float>(Generator(g).next_uniform()) == 1.0f);
  Generator at(g);
  const float r = rand({1}, DType::f32, at).item();
  CHECK(r < 1.0f);
  CHECK(r == std::nextafter(1.0f, 0.0f));
  Generator wide(g);
  CHECK(rand({1}, DType::f64, wide).item() < 1.0);
  Generator scaled(g);
  Tensor u = Tensor::empty({1});
  uniform_(u, -3.0, 5.0, scaled);
  CHECK(u.item() < 5.0);
}

TEST_CASE("normal_: mean and standard deviation", "[runtime][random]") {
  const DType dt = GENERATE(DType::f32, DType::f64);
  Generator g(2);
  Tensor t = randn({100000}, dt, g);
  Moments m = moments(t);
  CHECK(std::abs(m.mean) < 0.02);
  CHECK(std::abs(m.std - 1.0) < 0.02);
  CHECK(m.min < -3.5);  // the tails are there
  CHECK(m.max > 3.5);
  const auto v = values(t);
  CHECK(std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); }));

  Tensor u = Tensor::empty({100000}, dt);
  normal_(u, 2.0, 0.5, g);
  Moments mu = moments(u);
  CHECK(std::abs(mu.mean - 2.0) < 0.01);
  CHECK(std::abs(mu.std - 0.5) < 0.01);
}

TEST_CASE("random fills write only the view's elements, under no grad", "[runtime][random]") {
  Tensor base = Tensor::zeros({4, 6}, DType::f64);
  Tensor view = base.t().slice(0, 1, 6, 2);  // columns 1, 3, 5 of base
  Generator g(3);
  uniform_(view, 1.0, 2.0, g);
  auto v = values(base);
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 6; ++j) {
      INFO(i << ", " << j);
      if (j % 2 == 1) CHECK((v[i * 6 + j] >= 1.0 && v[i * 6 + j] <= 2.0));
      else CHECK(v[i * 6 + j] == 0.0);
    }
  // Values are assigned in the view's logical order.
  Generator g2(3);
  std::vector<double> expected = values(rand({3, 4}, DType::f64, g2));
  for (double& x : expected) x += 1.0;
  CHECK(values(view) == expected);
  // Parameters that require grad can be initialised.
  Tensor w = Tensor::empty({3, 3});
  w.requires_grad_();
  normal_(w, 0.0, 1.0, g);
  CHECK(w.requires_grad());
  CHECK(w.is_leaf());
  // Integer tensors cannot (16-bit floats can: the test above).
  Tensor i = Tensor::zeros({2}, DType::i64);
  CHECK_THROWS_WITH(uniform_(i, 0, 1, g), Contains("uniform_") && Contains("i64"));
  CHECK_THROWS_WITH(randn({2}, DType::i32, g), Contains("normal_") && Contains("i32"));
}

TEST_CASE("fan in and fan out as PyTorch computes them", "[runtime][random][init]") {
  CHECK(fan_in_and_out({30, 20}) == std::pair<int64_t, int64_t>{20, 30});
  CHECK(fan_in_and_out({8, 4, 3, 3}) == std::pair<int64_t, int64_t>{36, 72});
  CHECK(fan_in_and_out({5, 2, 7}) == std::pair<int64_t, int64_t>{14, 35});
  CHECK_THROWS_WITH(fan_in_and_out({10}), Contains("at least 2 dims") && Contains("[10]"));
}

TEST_CASE("kaiming and xavier bounds and spreads", "[runtime][random][init]") {
  Generator g(4);
  SECTION("kaiming_uniform_ with a = sqrt(5): bound 1/sqrt(fan_in)") {
    Tensor w = Tensor::empty({300, 400});
    kaiming_uniform_(w, std::sqrt(5.0), g);
    const double bound = 1.0 / std::sqrt(400.0);
    Moments m = moments(w);
    CHECK(m.max <= bound);
    CHECK(m.min >= -bound);
    CHECK(m.max > 0.99 * bound);
    CHECK(m.min < -0.99 * bound);
    CHECK(std::abs(m.mean) < 0.01 * bound);
    CHECK(m.std == Approx(bound / std::sqrt(3.0)).epsilon(0.01));
    // A conv weight: fan_in = in * kh * kw.
    Tensor c = Tensor::empty({16, 8, 3, 3});
    kaiming_uniform_(c, std::sqrt(5.0), g);
    Moments mc = moments(c);
    CHECK(mc.max <= 1.0 / std::sqrt(72.0));
    CHECK(mc.max > 0.95 / std::sqrt(72.0));
  }
  SECTION("kaiming_uniform_ with a = 0: bound sqrt(6 / fan_in)") {
    Tensor w = Tensor::empty({200, 150}, DType::f64);
    kaiming_uniform_(w, 0.0, g);
    const double bound = std::sqrt(6.0 / 150);
    Moments m = moments(w);
    CHECK(m.max <= bound);
    CHECK(m.max > 0.99 * bound);
    CHECK(m.min >= -bound);
  }
  SECTION("kaiming_normal_: std sqrt(2 / fan_in)") {
    Tensor w = Tensor::empty({400, 250});
    kaiming_normal_(w, 0.0, g);
    CHECK(moments(w).std == Approx(std::sqrt(2.0 / 250)).epsilon(0.01));
    CHECK(std::abs(moments(w).mean) < 0.02 * std::sqrt(2.0 / 250));
  }
  SECTION("xavier_uniform_: bound gain * sqrt(6 / (fan_in + fan_out))") {
    Tensor w = Tensor::empty({300, 100});
    xavier_uniform_(w, 2.0, g);
    const double bound = 2.0 * std::sqrt(6.0 / 400);
    Moments m = moments(w);
    CHECK(m.max <= bound);
    CHECK(m.min >= -bound);
    CHECK(m.max > 0.99 * bound);
    CHECK(m.min < -0.99 * bound);
  }
  SECTION("xavier_normal_: std gain * sqrt(2 / (fan_in + fan_out))") {
    Tensor w = Tensor::empty({300, 200}, DType::f64);
    xavier_normal_(w, 1.0, g);
    CHECK(moments(w).std == Approx(std::sqrt(2.0 / 500)).epsilon(0.02));
  }
  SECTION("1-D tensors have no fan in") {
    Tensor b = Tensor::empty({10});
    CHECK_THROWS_WITH(kaiming_uniform_(b, 0.0, g), Contains("at least 2 dims"));
    CHECK_THROWS_WITH(xavier_normal_(b, 1.0, g), Contains("at least 2 dims"));
  }
}

TEST_CASE("initialisers are reproducible for a seed", "[runtime][random][init]") {
  Generator a(11), b(11);
  Tensor wa = Tensor::empty({5, 4}), wb = Tensor::empty({5, 4});
  kaiming_uniform_(wa, std::sqrt(5.0), a);
  kaiming_uniform_(wb, std::sqrt(5.0), b);
  CHECK(values(wa) == values(wb));
  xavier_normal_(wa, 1.0, a);
  xavier_normal_(wb, 1.0, b);
  CHECK(values(wa) == values(wb));
}

TEST_CASE("randperm is a reproducible permutation", "[runtime][random]") {
  const int64_t n = GENERATE(0, 1, 2, 10, 1000);
  Generator g(6), h(6), other(7);
  auto p = randperm(n, g);
  REQUIRE(static_cast<int64_t>(p.size()) == n);
  auto sorted = p;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(n);
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(sorted == identity);
  CHECK(randperm(n, h) == p);
  if (n >= 10) {
    CHECK(randperm(n, other) != p);
    CHECK(p != identity);  // shuffled
    CHECK(randperm(n, g) != p);  // the generator moved on
  }
}

TEST_CASE("the default generator follows manual_seed", "[runtime][random]") {
  manual_seed(123);
  CHECK(default_generator().seed() == 123);
  CHECK(default_generator().offset() == 0);
  Tensor a = rand({10});
  Generator g(123);
  CHECK(values(a) == values(rand({10}, DType::f32, g)));
  manual_seed(123);
  CHECK(values(rand({10})) == values(a));
  CHECK(randperm(20) == randperm(20, g));
}

TEST_CASE("rand, randn and the initialisers fill bf16 and f16 tensors, rand below 1",
          "[runtime][random]") {
  // PyTorch fills 16-bit tensors too (nn.init.normal_ on a model.bfloat16()).
  const DType dt = GENERATE(DType::bf16, DType::f16);
  INFO(dtype_name(dt));
  // The same draws as f64, each value rounded once to 16 bits.
  Generator g16(3), g64(3);
  const Tensor n16 = randn({1000}, dt, g16);
  const Tensor n64 = randn({1000}, DType::f64, g64);
  CHECK(n16.dtype() == dt);
  CHECK((values(n16) == values(n64.to(dt))));
  Moments m = moments(n16);
  CHECK(std::abs(m.mean) < 0.1);
  CHECK(std::abs(m.std - 1.0) < 0.1);
  // Of 100,000 draws in [0, 1), those within half an ulp of 1 round up to 1
  // in 16 bits (about 1 in 512 for bf16): they must take the value below.
  Generator gu(4);
  const auto u = values(rand({100000}, dt, gu));
  const double below_one = dt == DType::bf16 ? 1.0 - 0x1p-8 : 1.0 - 0x1p-11;
  CHECK(*std::max_element(u.begin(), u.end()) == below_one);
  CHECK(*std::min_element(u.begin(), u.end()) >= 0.0);
  // A range with a negative top: the value below it is further from zero.
  Tensor neg = Tensor::empty({20000}, dt);
  Generator gn(5);
  uniform_(neg, -2.0, -1.0, gn);
  const auto vn = values(neg);
  CHECK(*std::max_element(vn.begin(), vn.end()) < -1.0);
  CHECK(*std::min_element(vn.begin(), vn.end()) >= -2.0);
  // The initialisers a model re-initialised after Module::to runs.
  Tensor w = Tensor::empty({64, 32}, dt);
  kaiming_uniform_(w, std::sqrt(5.0));
  const auto vw = values(w);
  const double bound = 1.0 / std::sqrt(32.0);
  CHECK(std::all_of(vw.begin(), vw.end(), [&](double x) { return std::abs(x) <= bound; }));
  xavier_normal_(w);
  CHECK(moments(w).std > 0.1);
}

TEST_CASE("uniform_ refuses a range its dtype cannot hold, as PyTorch", "[runtime][random]") {
  // f16's largest is 65504: the draws past it would be infinities.
  Tensor h = Tensor::empty({1000}, DType::f16);
  CHECK_THROWS_WITH(uniform_(h, -1e5, 1e5), Contains("uniform_") && Contains("f16"));
  CHECK_THROWS_WITH(uniform_(h, -4e4, 4e4), Contains("hi - lo"));  // a span past 65504
  Tensor f = Tensor::empty({10});
  CHECK_THROWS_WITH(uniform_(f, 0.0, 1e39), Contains("f32"));
  CHECK_THROWS_WITH(uniform_(f, 1.0, 0.0), Contains("lo <= hi"));
  CHECK_THROWS_WITH(uniform_(f, 0.0, std::nan("")), Contains("finite"));
  // The largest range f16 holds fills finite values.
  Generator g(1);
  uniform_(h, -3e4, 3e4, g);
  const auto v = values(h);
  CHECK(std::all_of(v.begin(), v.end(), [](double x) { return std::abs(x) <= 3e4; }));
}

TEST_CASE("normal_ refuses a negative or non-finite std, as PyTorch", "[runtime][random]") {
  Tensor f = Tensor::full({10}, 7.0f);
  CHECK_THROWS_WITH(normal_(f, 0.0, -1.0), Contains("normal_") && Contains("std -1"));
  CHECK_THROWS_WITH(normal_(f, 0.0, std::nan("")), Contains("finite"));
  CHECK_THROWS_WITH(normal_(f, INFINITY, 1.0), Contains("finite"));
  // The tensor is left as it was.
  const auto v = values(f);
  CHECK(std::all_of(v.begin(), v.end(), [](double x) { return x == 7.0; }));
  // std 0 is a constant fill, as PyTorch's.
  normal_(f, 2.5, 0.0);
  const auto c = values(f);
  CHECK(std::all_of(c.begin(), c.end(), [](double x) { return x == 2.5; }));
}
