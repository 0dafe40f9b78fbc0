// Views: reshape/view, permute/transpose, slice, select, expand, unsqueeze,
// squeeze, flatten; storage sharing; and their gradients.
#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <numeric>
#include <vector>

#include "lockstep/runtime/autograd/grad_mode.h"
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

bool shares_storage(const Tensor& a, const Tensor& b) { return a.storage() == b.storage(); }

}  // namespace

TEST_CASE("view and reshape of a contiguous tensor", "[runtime][views]") {
  const DType dt = GENERATE(DType::f32, DType::i64, DType::f16);
  Tensor t = iota({2, 3, 4}, dt);
  Tensor v = t.view({6, 4});
  CHECK(v.shape() == Shape{6, 4});
  CHECK(v.strides() == Shape{4, 1});
  CHECK(shares_storage(v, t));
  CHECK(values(v) == values(t));

  CHECK(t.view({-1}).shape() == Shape{24});
  CHECK(t.view({4, -1}).shape() == Shape{4, 6});
  CHECK(t.view({-1, 2, 3}).shape() == Shape{4, 2, 3});
  CHECK(t.reshape({3, -1, 2}).shape() == Shape{3, 4, 2});
  CHECK(shares_storage(t.reshape({24}), t));
  CHECK(t.view({1, 24, 1}).shape() == Shape{1, 24, 1});
  CHECK(Tensor::scalar(3.0).view({1, 1}).shape() == Shape{1, 1});
  CHECK(Tensor::zeros({1, 1}).view({}).shape().empty());
  CHECK(Tensor::zeros({0, 4}).view({2, 0, 2}).shape() == Shape{2, 0, 2});
  // With no elements, -1 could be any size: refused, as in PyTorch.
  CHECK_THROWS_WITH(Tensor::zeros({0, 4}).view({2, 0, -1}), Contains("[2, 0, -1]"));
}

TEST_CASE("view and reshape reject bad shapes", "[runtime][views]") {
  Tensor t = Tensor::zeros({2, 3, 4});
  CHECK_THROWS_WITH(t.view({5, -1}), Contains("[5, -1]") && Contains("24 elements"));
  CHECK_THROWS_WITH(t.view({-1, -1}), Contains("only one dimension can be -1"));
  CHECK_THROWS_WITH(t.reshape({7, 3}), Contains("[7, 3]"));
  CHECK_THROWS_WITH(t.view({-2, 12}), Contains("invalid size -2"));
  CHECK_THROWS_AS(Tensor::zeros({0, 4}).view({-1, 0}), lockstep::Error);
}

TEST_CASE("view of a non-contiguous tensor fails where it would need a copy", "[runtime][views]") {
  Tensor t = iota({3, 4});
  Tensor tt = t.t();  // [4, 3], strides [1, 4]
  CHECK_FALSE(tt.is_contiguous());
  CHECK_THROWS_AS(tt.view({12}), lockstep::Error);
  CHECK_THROWS_WITH(tt.view({12}), Contains("reshape") && Contains("contiguous"));
  CHECK_THROWS_WITH(tt.view({2, 6}), Contains("reshape"));

  // reshape copies instead, in logical order.
  Tensor r = tt.reshape({12});
  CHECK_FALSE(shares_storage(r, t));
  CHECK(values(r) == std::vector<double>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});

  // Splitting or adding size-1 dims keeps a view even when non-contiguous.
  Tensor split = tt.view({2, 2, 3});
  CHECK(shares_storage(split, t));
  CHECK(split.strides() == Shape{2, 1, 4});
  CHECK(values(split) == values(r));
  Tensor with_ones = tt.view({4, 1, 3, 1});
  CHECK(shares_storage(with_ones, t));
  CHECK(values(with_ones) == values(r));

  // A column slice: [3, 2] with strides [4, 1] cannot be flattened without a
  // copy. In [4, 3, 4] with strides [15, 5, 1] the outer two dims merge, the
  // inner two do not.
  Tensor cols = t.slice(1, 0, 2);
  CHECK_THROWS_WITH(cols.view({6}), Contains("reshape"));
  Tensor u = iota({4, 3, 5}).slice(2, 0, 4);
  CHECK(u.view({12, 4}).strides() == Shape{5, 1});
  CHECK(values(u.view({12, 4}))[4] == 5.0);
  CHECK(shares_storage(u.view({12, 4}), u));
  CHECK_THROWS_WITH(u.view({4, 12}), Contains("reshape"));
  CHECK(values(u.reshape({4, 12})) == values(u));
}

TEST_CASE("permute, transpose and t", "[runtime][views]") {
  Tensor t = iota({2, 3, 4});
  Tensor p = t.permute({2, 0, 1});
  CHECK(p.shape() == Shape{4, 2, 3});
  CHECK(p.strides() == Shape{1, 12, 4});
  CHECK(shares_storage(p, t));
  CHECK_FALSE(p.is_contiguous());
  // p[i][j][k] = t[j][k][i] = 12 j + 4 k + i.
  std::vector<double> expected;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 3; ++k) expected.push_back(12 * j + 4 * k + i);
  CHECK(values(p) == expected);
  CHECK(t.permute({-1, 0, 1}).shape() == Shape{4, 2, 3});
  CHECK(values(p.permute({1, 2, 0})) == values(t));  // the inverse permutation

  CHECK(t.transpose(0, 2).shape() == Shape{4, 3, 2});
  CHECK(t.transpose(-1, 0).strides() == Shape{1, 4, 12});
  CHECK(t.transpose(1, 1).strides() == t.strides());
  Tensor m = iota({2, 3});
  CHECK(m.t().shape() == Shape{3, 2});
  CHECK(values(m.t()) == std::vector<double>{0, 3, 1, 4, 2, 5});
  Tensor v = iota({3});
  CHECK(v.t().shape() == Shape{3});  // as in PyTorch: 1-D keeps its shape, as a new view
  CHECK_FALSE(v.t().is_same(v));
  CHECK_THROWS_WITH(t.t(), Contains("transpose(d0, d1)"));

  CHECK_THROWS_WITH(t.permute({0, 1}), Contains("permute"));
  CHECK_THROWS_WITH(t.permute({0, 1, 1}), Contains("repeated"));
  CHECK_THROWS_WITH(t.permute({0, 1, 3}), Contains("out of range"));
  CHECK_THROWS_WITH(t.transpose(0, 3), Contains("out of range"));
}

TEST_CASE("slice with steps and negative indices", "[runtime][views]") {
  Tensor t = iota({10});
  CHECK(values(t.slice(0, 2, 5)) == std::vector<double>{2, 3, 4});
  CHECK(values(t.slice(0, 1, 10, 3)) == std::vector<double>{1, 4, 7});
  CHECK(values(t.slice(0, 0, 10, 4)) == std::vector<double>{0, 4, 8});
  CHECK(values(t.slice(0, -3, 10)) == std::vector<double>{7, 8, 9});
  CHECK(values(t.slice(0, -4, -1)) == std::vector<double>{6, 7, 8});
  CHECK(values(t.slice(-1, -9, -2, 2)) == std::vector<double>{1, 3, 5, 7});
  // Out-of-range bounds clamp, as in Python.
  CHECK(values(t.slice(0, -100, 2)) == std::vector<double>{0, 1});
  CHECK(values(t.slice(0, 8, 100)) == std::vector<double>{8, 9});
  CHECK(t.slice(0, 5, 2).numel() == 0);
  CHECK(t.slice(0, 10, 12).numel() == 0);

  Tensor s = t.slice(0, 1, 10, 3);
  CHECK(s.strides() == Shape{3});
  CHECK(s.storage_offset() == 1);
  CHECK(shares_storage(s, t));

  Tensor m = iota({4, 5});
  Tensor ms = m.slice(1, 1, 5, 2).slice(0, -2, 4);
  CHECK(ms.shape() == Shape{2, 2});
  CHECK(values(ms) == std::vector<double>{11, 13, 16, 18});
  CHECK(ms.storage_offset() == 11);

  CHECK_THROWS_WITH(t.slice(0, 0, 5, 0), Contains("step"));
  CHECK_THROWS_WITH(t.slice(0, 0, 5, -1), Contains("step"));
  CHECK_THROWS_WITH(t.slice(1, 0, 5), Contains("out of range"));
}

TEST_CASE("select drops a dim", "[runtime][views]") {
  Tensor t = iota({3, 4});
  CHECK(t.select(0, 1).shape() == Shape{4});
  CHECK(values(t.select(0, 1)) == std::vector<double>{4, 5, 6, 7});
  CHECK(values(t.select(1, -1)) == std::vector<double>{3, 7, 11});
  CHECK(values(t.select(0, -3)) == std::vector<double>{0, 1, 2, 3});
  CHECK(t.select(0, 2).select(0, 3).item() == 11.0);
  CHECK(shares_storage(t.select(1, 2), t));
  CHECK_THROWS_WITH(t.select(0, 3), Contains("index 3") && Contains("size 3"));
  CHECK_THROWS_WITH(t.select(1, -5), Contains("out of range"));
}

TEST_CASE("expand uses stride 0; contiguous materialises it", "[runtime][views]") {
  Tensor col = Tensor::from_vector<float>({1, 2, 3}, {3, 1});
  Tensor e = col.expand({3, 4});
  CHECK(e.shape() == Shape{3, 4});
  CHECK(e.strides() == Shape{1, 0});
  CHECK(shares_storage(e, col));
  CHECK_FALSE(e.is_contiguous());
  CHECK(values(e) == std::vector<double>{1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3});

  Tensor c = e.contiguous();
  CHECK(c.is_contiguous());
  CHECK(c.strides() == Shape{4, 1});
  CHECK_FALSE(shares_storage(c, col));
  CHECK(values(c) == values(e));
  CHECK(c.contiguous().is_same(c));  // already contiguous: itself

  // New leading dims, -1 keeps a size.
  Tensor row = Tensor::from_vector<float>({5, 6}, {2});
  Tensor e2 = row.expand({2, 3, -1});
  CHECK(e2.shape() == Shape{2, 3, 2});
  CHECK(e2.strides() == Shape{0, 0, 1});
  CHECK(values(e2) == std::vector<double>{5, 6, 5, 6, 5, 6, 5, 6, 5, 6, 5, 6});
  CHECK(Tensor::scalar(4).expand({2, 2}).strides() == Shape{0, 0});

  CHECK_THROWS_WITH(col.expand({2, 4}), Contains("cannot expand") && Contains("[3, 1]"));
  CHECK_THROWS_WITH(col.expand({4}), Contains("fewer dims"));
  CHECK_THROWS_WITH(row.expand({-1, 2}), Contains("-1"));
}

TEST_CASE("t, transpose and squeeze that keep the shape return a new view, not the tensor",
          "[runtime][views][autograd]") {
  // As PyTorch (`w.t() is w` is False): a caller that changes the result's
  // requires_grad or .grad must not change the input's.
  Tensor vec = Tensor::ones({3}), mat = Tensor::ones({1, 3}), scalar = Tensor::scalar(1);
  struct Case {
    const char* name;
    Tensor base;
    std::function<Tensor(const Tensor&)> op;
  };
  const std::vector<Case> cases = {
      {"t() of 1-D", vec, [](const Tensor& a) { return a.t(); }},
      {"t() of 0-D", scalar, [](const Tensor& a) { return a.t(); }},
      {"transpose of 0-D", scalar, [](const Tensor& a) { return a.transpose(0, -1); }},
      {"squeeze of a dim not of size 1", mat, [](const Tensor& a) { return a.squeeze(1); }},
      {"squeeze of 0-D", scalar, [](const Tensor& a) { return a.squeeze(0); }},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    Tensor base = c.base.clone().requires_grad_();
    Tensor v = c.op(base);
    CHECK_FALSE(v.is_same(base));
    CHECK(shares_storage(v, base));
    CHECK(v.shape() == base.shape());
    CHECK_FALSE(v.is_leaf());
    CHECK_THROWS_WITH(v.requires_grad_(false), Contains("leaf"));
    CHECK(base.requires_grad());
    sum(mul(v, 3.0)).backward();
    CHECK(values(base.grad()) == std::vector<double>(static_cast<size_t>(base.numel()), 3.0));
    CHECK_FALSE(v.grad().defined());
    {
      NoGradGuard no_grad;  // no history: a leaf of its own
      Tensor w = c.op(base);
      CHECK_FALSE(w.is_same(base));
      w.set_grad(Tensor::zeros(w.shape()));
      w.requires_grad_(false);
    }
    CHECK(base.requires_grad());
    CHECK(values(base.grad()) == std::vector<double>(static_cast<size_t>(base.numel()), 3.0));
  }
}

TEST_CASE("unsqueeze, squeeze and flatten", "[runtime][views]") {
  Tensor t = iota({2, 3});
  CHECK(t.unsqueeze(0).shape() == Shape{1, 2, 3});
  CHECK(t.unsqueeze(1).shape() == Shape{2, 1, 3});
  CHECK(t.unsqueeze(-1).shape() == Shape{2, 3, 1});
  CHECK(t.unsqueeze(2).shape() == Shape{2, 3, 1});
  CHECK(shares_storage(t.unsqueeze(1), t));
  CHECK(t.t().unsqueeze(1).shape() == Shape{3, 1, 2});  // non-contiguous works too
  CHECK(values(t.t().unsqueeze(1)) == values(t.t()));
  CHECK(Tensor::scalar(1).unsqueeze(0).shape() == Shape{1});
  CHECK_THROWS_WITH(t.unsqueeze(4), Contains("out of range"));

  Tensor u = Tensor::zeros({1, 3, 1});
  CHECK(u.squeeze(0).shape() == Shape{3, 1});
  CHECK(u.squeeze(-1).shape() == Shape{1, 3});
  CHECK(u.squeeze(1).shape() == Shape{1, 3, 1});  // not size 1: unchanged
  CHECK(shares_storage(u.squeeze(0), u));

  Tensor f = iota({2, 3, 4});
  CHECK(f.flatten().shape() == Shape{24});
  CHECK(f.flatten(1).shape() == Shape{2, 12});
  CHECK(f.flatten(0, 1).shape() == Shape{6, 4});
  CHECK(f.flatten(-2, -1).shape() == Shape{2, 12});
  CHECK(f.flatten(1, 1).shape() == Shape{2, 3, 4});
  CHECK(shares_storage(f.flatten(1), f));
  CHECK(Tensor::scalar(2).flatten().shape() == Shape{1});
  Tensor ft = f.permute({2, 1, 0}).flatten(1);  // needs a copy
  CHECK(ft.shape() == Shape{4, 6});
  CHECK(values(ft)[1] == 12.0);  // ft[0][1] = p[0][0][1] = f[1][0][0]
  CHECK_THROWS_WITH(f.flatten(2, 1), Contains("start_dim"));
}

TEST_CASE("unsqueeze and flatten name a dim out of range against the tensor's own dims",
          "[runtime][views]") {
  // unsqueeze said "for a tensor with 3 dims" of a 2-D tensor; a 0-d tensor's
  // flatten took any dims at all.
  Tensor t = iota({2, 3});
  CHECK_THAT(error_of([&] { t.unsqueeze(4); }),
             Contains("unsqueeze: dim 4 is out of range for a tensor with 2 dims") &&
                 Contains("expected -3..2"));
  CHECK_THAT(error_of([&] { t.unsqueeze(-4); }), Contains("dim -4"));
  CHECK_THAT(error_of([] { Tensor::scalar(2).flatten(3); }), Contains("dimension 3"));
  CHECK_THAT(error_of([] { Tensor::scalar(2).flatten(0, 2); }), Contains("dimension 2"));
  CHECK(Tensor::scalar(2).flatten(-1, 0).shape() == Shape{1});
}

TEST_CASE("writes through a view change the base; clones are independent", "[runtime][views]") {
  Tensor base = Tensor::zeros({3, 4});
  {
    NoGradGuard no_grad;
    base.select(0, 1).fill_(1.0);
    base.t().select(0, 3).fill_(2.0);  // column 3
    base.view({12}).slice(0, 0, 12, 5).add_(Tensor::scalar(10.0));  // elements 0, 5, 10
    base.slice(1, 0, 1).mul_(2.0);  // column 0
  }
  CHECK(values(base) == std::vector<double>{20, 0, 0, 2, 2, 11, 1, 2, 0, 0, 10, 2});

  const uint64_t v = base.version();
  Tensor view = base.t();
  view.select(0, 0).zero_();
  CHECK(view.version() == base.version());  // one counter per storage
  CHECK(base.version() > v);
  CHECK(values(base)[4] == 0.0);

  Tensor c = base.slice(0, 0, 2).clone();
  CHECK(c.is_contiguous());
  CHECK_FALSE(shares_storage(c, base));
  const uint64_t vb = base.version();
  c.fill_(-1.0);
  CHECK(base.version() == vb);
  CHECK(values(base)[1] == 0.0);
  CHECK(values(c) == std::vector<double>(8, -1.0));
}

TEST_CASE("flatten of a permuted tensor copies in logical order", "[runtime][views]") {
  Tensor f = iota({2, 3, 4});
  Tensor p = f.permute({2, 1, 0});  // p[i][j][k] = f[k][j][i] = 12 k + 4 j + i
  Tensor flat = p.flatten(1);
  std::vector<double> expected;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 2; ++k) expected.push_back(12 * k + 4 * j + i);
  CHECK(values(flat) == expected);
  CHECK_FALSE(shares_storage(flat, f));
}

TEST_CASE("view ops are differentiable", "[runtime][views][gradcheck]") {
  Tensor x = random_input({3, 4}, 1);
  auto check = [&](const char* name, std::function<Tensor(const Tensor&)> op) {
    check_grad(name, [&](const std::vector<Tensor>& in) { return op(in[0]); }, {x});
  };
  check("view", [](const Tensor& a) { return a.view({2, 6}); });
  check("reshape copy", [](const Tensor& a) { return a.t().reshape({12}); });
  check("permute", [](const Tensor& a) { return a.unsqueeze(0).permute({2, 0, 1}); });
  check("transpose", [](const Tensor& a) { return a.transpose(0, 1); });
  check("slice", [](const Tensor& a) { return a.slice(1, 0, 4, 1).slice(1, -3, 4, 2); });
  check("select", [](const Tensor& a) { return a.select(1, -2); });
  check("expand", [](const Tensor& a) { return a.slice(1, 0, 1).expand({2, 3, 5}); });
  check("squeeze/unsqueeze", [](const Tensor& a) { return a.unsqueeze(1).squeeze(1).unsqueeze(-1); });
  check("flatten", [](const Tensor& a) { return a.t().flatten(); });
  check("contiguous", [](const Tensor& a) { return a.t().contiguous(); });
  check("clone", [](const Tensor& a) { return a.clone(); });
  // Overlapping views: the gradient of an expanded view sums.
  check("slices that overlap",
        [](const Tensor& a) { return add(a.slice(1, 0, 3), a.slice(1, 1, 4)); });
}

TEST_CASE("view gradients have the right values", "[runtime][views][autograd]") {
  Tensor x = Tensor::zeros({2, 3});
  x.requires_grad_();
  // Each element of x is used (1 + (column == 1)) times via the expand, x2 for the
  // slice of column 1.
  Tensor y = add(sum(x.unsqueeze(0).expand({4, 2, 3})), sum(mul(x.slice(1, 1, 2), 2.0)));
  y.backward();
  CHECK(values(x.grad()) == std::vector<double>{4, 6, 4, 4, 6, 4});
  CHECK(x.grad().dtype() == DType::f32);

  Tensor z = Tensor::zeros({3}, DType::f64);
  z.requires_grad_();
  sum(z.to(DType::f32)).backward();
  CHECK(z.grad().dtype() == DType::f64);
  CHECK(values(z.grad()) == std::vector<double>{1, 1, 1});
}

TEST_CASE("view agrees with a copy for random layouts and shapes", "[runtime][views]") {
  // Random chains of permute and slice, then views to random shapes with the
  // same element count: where view succeeds it must alias the storage and
  // read the same values as a contiguous copy; a contiguous tensor must
  // always be viewable; reshape must always give the copy's values.
  Generator g(17);
  auto pick = [&](int64_t n) { return static_cast<int64_t>(g.next_u32() % static_cast<uint32_t>(n)); };
  int viewed = 0, refused = 0;
  for (int trial = 0; trial < 300; ++trial) {
    Shape shape;
    const int64_t nd = 1 + pick(4);
    for (int64_t d = 0; d < nd; ++d) shape.push_back(1 + pick(4));
    Tensor t = iota(shape, DType::f64);
    for (int op = 0; op < 3; ++op) {
      if (pick(2) == 0) {
        std::vector<int64_t> perm(t.dim());
        std::iota(perm.begin(), perm.end(), 0);
        for (int64_t i = t.dim() - 1; i > 0; --i) std::swap(perm[i], perm[pick(i + 1)]);
        t = t.permute(perm);
      } else {
        const int64_t d = pick(t.dim());
        const int64_t n = t.size(d);
        const int64_t start = pick(n);
        t = t.slice(d, start, n, 1 + pick(2));
      }
    }
    // A random target shape: the prime factors of numel, grouped at random,
    // with a few size-1 dims mixed in.
    int64_t rest = t.numel();
    std::vector<int64_t> factors;
    for (int64_t p = 2; rest > 1;) {
      if (rest % p == 0) {
        factors.push_back(p);
        rest /= p;
      } else {
        ++p;
      }
    }
    Shape target;
    for (int64_t f : factors) {
      if (!target.empty() && pick(2) == 0) target.back() *= f;
      else target.push_back(f);
      if (pick(4) == 0) target.push_back(1);
    }
    INFO("trial " << trial << ": shape " << shape_str(t.shape()) << " strides "
                  << shape_str(t.strides()) << " -> " << shape_str(target));
    const std::vector<double> expected = values(t.contiguous());
    CHECK(values(t.reshape(target)) == expected);
    try {
      Tensor v = t.view(target);
      ++viewed;
      CHECK(v.shape() == target);
      CHECK(shares_storage(v, t));
      CHECK(values(v) == expected);
    } catch (const lockstep::Error&) {
      ++refused;
      CHECK_FALSE(t.is_contiguous());
    }
  }
  CHECK(viewed > 50);  // both outcomes are exercised
  CHECK(refused > 20);
}

TEST_CASE("an empty tensor is contiguous whatever its strides, as PyTorch's",
          "[runtime][views]") {
  // Transposed, the stride of the size-0 dim no longer matched a row-major
  // layout, so these counted as strided: collectives refused them and
  // contiguous() copied them.
  for (const Tensor& t : {Tensor::zeros({0, 3}).t(), Tensor::zeros({3, 0}).t(),
                          Tensor::zeros({2, 0, 3}).transpose(0, 2),
                          Tensor::zeros({4, 0}).slice(0, 0, 4, 2)}) {
    INFO("shape " << shape_str(t.shape()) << ", strides " << shape_str(t.strides()));
    CHECK(t.numel() == 0);
    CHECK(t.is_contiguous());
    CHECK(t.contiguous().storage() == t.storage());
    CHECK(t.reshape({-1}).numel() == 0);
  }
}
