// Autograd: requires_grad propagation, accumulation, retain_graph, no_grad,
// detach, the errors for misuse, and post-accumulate-grad hooks.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/ops/activation.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/linalg.h"
#include "lockstep/runtime/ops/loss.h"
#include "lockstep/runtime/ops/norm.h"
#include "lockstep/runtime/ops/pool.h"
#include "lockstep/runtime/ops/reduce.h"
#include "lockstep/runtime/random.h"
#include "lockstep/runtime/tensor.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

namespace {

Tensor leaf(const std::vector<double>& v, const Shape& shape) {
  Tensor t = Tensor::from_vector<double>(v, shape);
  t.requires_grad_();
  return t;
}

}  // namespace

TEST_CASE("requires_grad propagates to results; leaves and grad_fn", "[runtime][autograd]") {
  Tensor a = leaf({1, 2, 3}, {3});
  Tensor b = Tensor::ones({3}, DType::f64);
  CHECK(a.requires_grad());
  CHECK(a.is_leaf());
  CHECK(a.grad_fn() == nullptr);
  CHECK_FALSE(b.requires_grad());
  CHECK_FALSE(a.grad().defined());

  Tensor c = add(a, b);
  CHECK(c.requires_grad());
  CHECK_FALSE(c.is_leaf());
  REQUIRE(c.grad_fn() != nullptr);
  CHECK(c.grad_fn()->name() == "AddBackward");
  CHECK(c.grad_fn()->next.size() == 2);
  CHECK(c.grad_fn()->next[0] != nullptr);  // a's accumulator
  CHECK(c.grad_fn()->next[1] == nullptr);  // b needs no gradient

  Tensor d = mul(b, b);
  CHECK_FALSE(d.requires_grad());
  CHECK(d.is_leaf());
  CHECK(mul(exp(c), d).requires_grad());
  // Views of a leaf that requires grad carry history too.
  CHECK(a.view({3, 1}).requires_grad());
  CHECK_FALSE(a.view({3, 1}).is_leaf());
}

TEST_CASE("requires_grad_ rules", "[runtime][autograd]") {
  Tensor i = Tensor::zeros({2}, DType::i64);
  CHECK_THROWS_WITH(i.requires_grad_(), Contains("floating") && Contains("i64"));
  i.requires_grad_(false);  // turning it off is always fine
  Tensor a = leaf({1, 2}, {2});
  Tensor b = mul(a, 2.0);
  // On a computed tensor, asking for grad again changes nothing (as in
  // PyTorch); turning it off is refused.
  b.requires_grad_();
  CHECK(b.requires_grad());
  CHECK(b.grad_fn() != nullptr);
  CHECK_THROWS_WITH(b.requires_grad_(false), Contains("leaf") && Contains("detach"));
  a.requires_grad_(false);
  CHECK_FALSE(a.requires_grad());
  CHECK_FALSE(mul(a, 2.0).requires_grad());
}

TEST_CASE("backward computes gradients; a tensor used twice gets the sum", "[runtime][autograd]") {
  Tensor x = leaf({1, -2, 3}, {3});
  Tensor y = sum(mul(x, x));  // dy/dx = 2x
  y.backward();
  CHECK(values(x.grad()) == std::vector<double>{2, -4, 6});
  CHECK(x.grad().dtype() == DType::f64);
  CHECK(x.grad().shape() == x.shape());
  CHECK_FALSE(x.grad().requires_grad());

  // x used in three places with different paths: d/dx (x*x + 3x + x) = 2x + 4.
  Tensor z = leaf({1, -2, 3}, {3});
  sum(add(add(mul(z, z), mul(z, 3.0)), z)).backward();
  CHECK(values(z.grad()) == std::vector<double>{6, 0, 10});

  // A diamond: u = 2w; v = u*u + u -> dv/dw = 2 * (2u + 1).
  Tensor w = leaf({0.5, 1.0}, {2});
  Tensor u = mul(w, 2.0);
  sum(add(mul(u, u), u)).backward();
  CHECK(values(w.grad()) == std::vector<double>{6, 10});
}

TEST_CASE("gradients accumulate across backward calls", "[runtime][autograd]") {
  Tensor x = leaf({1, 2}, {2});
  sum(mul(x, x)).backward();
  CHECK(values(x.grad()) == std::vector<double>{2, 4});
  sum(mul(x, 3.0)).backward();  // a new graph
  CHECK(values(x.grad()) == std::vector<double>{5, 7});
  x.set_grad(Tensor());
  CHECK_FALSE(x.grad().defined());
  sum(x).backward();
  CHECK(values(x.grad()) == std::vector<double>{1, 1});
  CHECK_THROWS_WITH(x.set_grad(Tensor::zeros({3}, DType::f64)), Contains("[3]"));
}

TEST_CASE("the accumulated grad never aliases a caller's tensor", "[runtime][autograd]") {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor g = Tensor::from_vector<double>({1, 1, 1}, {3});
  x.backward(g);  // a leaf's own backward: the seed goes straight to .grad
  CHECK(values(x.grad()) == std::vector<double>{1, 1, 1});
  x.backward(g);
  CHECK(values(x.grad()) == std::vector<double>{2, 2, 2});
  CHECK(values(g) == std::vector<double>{1, 1, 1});  // accumulation did not write into g

  // A pass-through op hands the same buffer on.
  Tensor y = leaf({1, 2}, {2});
  Tensor h = Tensor::from_vector<double>({3, 4}, {2});
  add(y, 0.0).backward(h);
  add(y, 0.0).backward(h);
  CHECK(values(y.grad()) == std::vector<double>{6, 8});
  CHECK(values(h) == std::vector<double>{3, 4});
}

TEST_CASE("gradients from several sums of the same leaf add up", "[runtime][autograd]") {
  // sum's backward hands on an expanded (stride-0) view; adding a second
  // gradient into it must not write through the shared element.
  Tensor x = leaf({1, 1, 1, 1}, {4});
  add(mul(sum(x), 2.0), mul(sum(x), 3.0)).backward();
  CHECK(values(x.grad()) == std::vector<double>{5, 5, 5, 5});

  Tensor w = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor a = mul(sum(w, {0}, true), 2.0);  // [1, 3]
  Tensor b = mul(mean(w, {1}, true), 3.0);  // [2, 1]
  sum(add(add(a, b), mul(sum(w), 1.0))).backward();
  // d/dw of sum over the broadcast [2, 3] of a: each a_j counted twice, times 2;
  // b_i counted 3 times, times 3 / 3; the total sum counted 6 times.
  CHECK(values(w.grad()) == std::vector<double>(6, 4 + 3 + 6));
}

TEST_CASE("retain_graph allows a second backward; without it, a clear error",
          "[runtime][autograd]") {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = sum(mul(x, x));
  y.backward({}, /*retain_graph=*/true);
  y.backward({}, true);
  CHECK(values(x.grad()) == std::vector<double>{4, 8});
  y.backward();  // frees the graph
  CHECK(values(x.grad()) == std::vector<double>{6, 12});
  CHECK_THROWS_AS(y.backward(), lockstep::Error);
  CHECK_THROWS_WITH(y.backward(), Contains("second time") && Contains("retain_graph"));
  CHECK(values(x.grad()) == std::vector<double>{6, 12});

  // The same through an op whose saved tensor is its own output (exp).
  Tensor z = leaf({0.0}, {1});
  Tensor e = sum(exp(z));
  e.backward();
  CHECK_THROWS_WITH(e.backward(), Contains("second time") && Contains("ExpBackward"));
}

TEST_CASE("a graph as long as a loss added up over many steps is freed without a stack overflow",
          "[runtime][autograd]") {
  // Each node of the chain holds the one before it; freeing it from the
  // last must not take a stack frame per node (200,000 overflowed 8 MiB).
  Tensor x = leaf({1}, {1});
  Tensor total = mul(x, 0.0);
  constexpr int kSteps = 500000;
  for (int i = 0; i < kSteps; ++i) total = add(total, x);
  total.backward();
  CHECK(values(x.grad()) == std::vector<double>{kSteps});
  total = Tensor();  // the whole chain goes here
  CHECK(x.use_count() == 1);
}

TEST_CASE("backward frees what a node's backward function captured with its saved tensors",
          "[runtime][autograd]") {
  // Statistics captured by value (as the normalisations capture theirs) are
  // freed by the backward that frees the saved tensors, not held as long as
  // the graph (a loss kept for logging) is.
  Tensor x = leaf({1, 2, 3}, {3});
  const Tensor stats = Tensor::from_vector<double>({4, 5, 6}, {3});
  const auto scaled = [&stats](const Tensor& in) {
    return record(mul(in.detach(), stats), "Scaled", {in}, {in}, [stats](const BackwardArgs& a) {
      return std::vector<Tensor>{mul(a.grad, stats)};
    });
  };
  Tensor y = sum(scaled(x));
  REQUIRE(stats.use_count() == 2);
  y.backward({}, /*retain_graph=*/true);
  CHECK(stats.use_count() == 2);  // kept for the next backward
  y.backward();
  CHECK(values(x.grad()) == std::vector<double>{8, 10, 12});
  CHECK(stats.use_count() == 1);
  CHECK_THROWS_WITH(y.backward(), Contains("second time") && Contains("Scaled"));

  // A node whose saved tensors were all undefined refuses a second backward
  // too, instead of running without them.
  Tensor w = leaf({1, 2}, {2});
  Tensor z = sum(record(mul(w.detach(), 3.0), "NoBias", {w}, {Tensor()},
                        [](const BackwardArgs& a) {
                          return std::vector<Tensor>{mul(a.grad, 3.0)};
                        }));
  z.backward();
  CHECK_THROWS_WITH(z.backward(), Contains("second time") && Contains("NoBias"));
  CHECK(values(w.grad()) == std::vector<double>{3, 3});
}

TEST_CASE("max and max_pool2d free their indices in backward; a second backward is an error",
          "[runtime][autograd]") {
  // Their indices are what backward needs, as a saved tensor is: freed by the
  // first backward (not held while the graph lives), so a second backward
  // without retain_graph is refused instead of adding the gradient again.
  Tensor x = leaf({1, 5, 3, 2}, {2, 2});
  Tensor m = sum(max(x, 1));
  m.backward();
  CHECK(values(x.grad()) == std::vector<double>{0, 1, 1, 0});
  CHECK_THROWS_WITH(m.backward(), Contains("second time") && Contains("MaxBackward"));
  CHECK(values(x.grad()) == std::vector<double>{0, 1, 1, 0});

  Tensor p = leaf({1, 5, 3, 2}, {1, 1, 2, 2});
  Tensor pooled = sum(max_pool2d(p, {}));
  pooled.backward({}, /*retain_graph=*/true);
  pooled.backward();
  CHECK(values(p.grad()) == std::vector<double>{0, 2, 0, 0});
  CHECK_THROWS_WITH(pooled.backward(), Contains("second time") && Contains("MaxPool2dBackward"));
  CHECK(values(p.grad()) == std::vector<double>{0, 2, 0, 0});
}

TEST_CASE("backward needs something to differentiate and a fitting gradient",
          "[runtime][autograd]") {
  Tensor a = Tensor::ones({2}, DType::f64);
  CHECK_THROWS_AS(sum(a).backward(), lockstep::Error);
  CHECK_THROWS_WITH(sum(a).backward(), Contains("does not require grad"));

  Tensor x = leaf({1, 2, 3}, {3});
  Tensor y = mul(x, 2.0);
  CHECK_THROWS_WITH(y.backward(), Contains("[3]") && Contains("gradient"));
  CHECK_THROWS_WITH(y.backward(Tensor::ones({2}, DType::f64)), Contains("[2]") && Contains("[3]"));
  CHECK_FALSE(x.grad().defined());  // nothing ran

  // An explicit gradient for a non-scalar output: the vector-Jacobian product.
  y.backward(Tensor::from_vector<double>({1, 2, 3}, {3}));
  CHECK(values(x.grad()) == std::vector<double>{2, 4, 6});

  // A one-element output of any rank is seeded with one.
  Tensor z = leaf({2}, {1, 1});
  mul(z, z).backward();
  CHECK(values(z.grad()) == std::vector<double>{4});
}

TEST_CASE("a gradient of another dtype is taken at the output's dtype", "[runtime][autograd]") {
  // As PyTorch: an f64 gradient for an f32 output (or a bf16 one) is
  // converted, so the op's backward kernel reads it at its own dtype.
  Tensor x = Tensor::from_vector<float>({1, -2, 3, 4, 5, -6}, {2, 3});
  x.requires_grad_();
  const Tensor w = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  layer_norm(x, {3}).backward(w);
  const std::vector<double> want = values(x.grad());
  x.set_grad(Tensor());
  layer_norm(x, {3}).backward(w.to(DType::f64));
  CHECK(x.grad().dtype() == DType::f32);
  CHECK(values(x.grad()) == want);
}

TEST_CASE("no_grad records nothing and restores the mode", "[runtime][autograd]") {
  Tensor x = leaf({1, 2}, {2});
  CHECK(grad_enabled());
  {
    NoGradGuard no_grad;
    CHECK_FALSE(grad_enabled());
    Tensor y = mul(x, x);
    CHECK_FALSE(y.requires_grad());
    CHECK(y.is_leaf());
    CHECK(y.grad_fn() == nullptr);
    CHECK_FALSE(x.view({2, 1}).requires_grad());
    {
      NoGradGuard nested;
      CHECK_FALSE(grad_enabled());
    }
    CHECK_FALSE(grad_enabled());  // the inner guard restores "off"
    CHECK_THROWS_WITH(y.backward(), Contains("does not require grad"));
  }
  CHECK(grad_enabled());
  CHECK(mul(x, x).requires_grad());

  // An exception inside the scope still restores the mode.
  try {
    NoGradGuard no_grad;
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  CHECK(grad_enabled());
}

TEST_CASE("detach shares storage and has no history", "[runtime][autograd]") {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor y = mul(x, 2.0);
  Tensor d = y.detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.is_leaf());
  CHECK(d.grad_fn() == nullptr);
  CHECK(d.storage() == y.storage());
  CHECK(d.shape() == y.shape());
  d.fill_(7.0);  // allowed: d does not require grad
  CHECK(values(y) == std::vector<double>{7, 7, 7});
  // The detached leaf of a parameter is a handle for in-place updates.
  Tensor xd = x.detach();
  xd.add_(Tensor::ones({3}, DType::f64));
  CHECK(values(x) == std::vector<double>{2, 3, 4});
  // Using detach() in a graph cuts it there.
  Tensor z = sum(mul(x.detach(), x));
  z.backward();
  CHECK(values(x.grad()) == std::vector<double>{2, 3, 4});
}

TEST_CASE("in-place change of a tensor saved for backward is reported", "[runtime][autograd]") {
  SECTION("a saved operand that does not require grad") {
    Tensor x = leaf({1, 2}, {2});
    Tensor w = Tensor::from_vector<double>({3, 4}, {2});
    Tensor y = sum(mul(x, w));  // saves w
    w.mul_(2.0);
    CHECK_THROWS_AS(y.backward(), lockstep::Error);
    CHECK_THROWS_WITH(y.backward(), Contains("in-place") && Contains("MulBackward"));
  }
  SECTION("the leaf itself, changed under no_grad") {
    Tensor x = leaf({1, 2}, {2});
    Tensor y = sum(mul(x, x));
    {
      NoGradGuard no_grad;
      x.add_(Tensor::ones({2}, DType::f64));
    }
    CHECK_THROWS_WITH(y.backward(), Contains("in-place"));
  }
  SECTION("through a view sharing the storage") {
    Tensor x = leaf({1, 2, 3, 4}, {4});
    Tensor base = Tensor::from_vector<double>({1, 1, 1, 1}, {4});
    Tensor y = sum(mul(x, base.view({4})));
    base.slice(0, 3, 4).fill_(0.0);
    CHECK_THROWS_WITH(y.backward(), Contains("in-place"));
  }
  SECTION("a saved output (exp saves its result)") {
    Tensor x = leaf({0, 1}, {2});
    Tensor e = exp(x);
    Tensor y = sum(e);
    e.detach().zero_();
    CHECK_THROWS_WITH(y.backward(), Contains("in-place") && Contains("ExpBackward"));
  }
  SECTION("an op that saves nothing does not mind") {
    Tensor x = leaf({1, 2}, {2});
    Tensor w = Tensor::from_vector<double>({3, 4}, {2});
    Tensor y = sum(add(x, w));
    w.mul_(2.0);
    y.backward();
    CHECK(values(x.grad()) == std::vector<double>{1, 1});
  }
}

TEST_CASE("in-place ops on leaves that require grad are refused under grad mode",
          "[runtime][autograd]") {
  Tensor x = leaf({1, 2}, {2});
  CHECK_THROWS_WITH(x.fill_(0.0), Contains("fill_") && Contains("requires grad"));
  CHECK_THROWS_WITH(x.add_(Tensor::ones({2}, DType::f64)), Contains("add_"));
  CHECK_THROWS_WITH(x.mul_(2.0), Contains("mul_"));
  CHECK_THROWS_WITH(x.zero_(), Contains("NoGradGuard"));
  CHECK_THROWS_WITH(x.copy_(Tensor::ones({2}, DType::f64)), Contains("copy_"));
  CHECK_THROWS_WITH(x.slice(0, 0, 1).fill_(0.0), Contains("fill_"));  // a view of it too
  CHECK(values(x) == std::vector<double>{1, 2});
  {
    NoGradGuard no_grad;
    x.mul_(2.0);  // as an optimizer does
  }
  CHECK(values(x) == std::vector<double>{2, 4});
}

TEST_CASE("a leaf frozen between forward and backward takes no gradient",
          "[runtime][autograd]") {
  // As PyTorch's AccumulateGrad: the flag is read when the gradient arrives,
  // so freezing part of a model after its loss was computed leaves it alone.
  Tensor frozen = leaf({1, 2}, {2});
  Tensor trained = leaf({3, 4}, {2});
  int hook_calls = 0;
  frozen.register_post_accumulate_grad_hook([&](Tensor&) { ++hook_calls; });
  Tensor loss = sum(mul(frozen, trained));
  frozen.requires_grad_(false);
  loss.backward();
  CHECK_FALSE(frozen.grad().defined());
  CHECK(hook_calls == 0);
  CHECK(values(trained.grad()) == std::vector<double>{1, 2});
}

TEST_CASE("post-accumulate-grad hooks see the new grad and fire once per accumulation",
          "[runtime][autograd][hooks]") {
  Tensor w = leaf({1, 2, 3}, {3});
  std::vector<std::vector<double>> seen;
  w.register_post_accumulate_grad_hook([&](Tensor& t) {
    CHECK(t.is_same(w));
    seen.push_back(values(t.grad()));
  });
  sum(mul(w, w)).backward();
  REQUIRE(seen.size() == 1);
  CHECK(seen[0] == std::vector<double>{2, 4, 6});
  sum(mul(w, 10.0)).backward();
  REQUIRE(seen.size() == 2);
  CHECK(seen[1] == std::vector<double>{12, 14, 16});  // after accumulation

  // Used twice in one graph: the hook fires once, with the sum.
  sum(add(mul(w, 2.0), mul(w, w))).backward();
  REQUIRE(seen.size() == 3);
  CHECK(seen[2] == std::vector<double>{16, 20, 24});  // 12 + (2 + 2*1), 14 + (2 + 2*2), 16 + (2 + 2*3)

  // No backward through w: no call.
  Tensor other = leaf({1}, {1});
  sum(other).backward();
  CHECK(seen.size() == 3);
}

TEST_CASE("post-accumulate-grad hooks: remove_hook and several hooks", "[runtime][autograd][hooks]") {
  Tensor w = leaf({1, 2}, {2});
  std::vector<std::string> calls;
  int64_t a = w.register_post_accumulate_grad_hook([&](Tensor&) { calls.push_back("a"); });
  int64_t b = w.register_post_accumulate_grad_hook([&](Tensor&) { calls.push_back("b"); });
  CHECK(a != b);
  sum(w).backward();
  CHECK(calls == std::vector<std::string>{"a", "b"});  // registration order
  w.remove_hook(a);
  sum(w).backward();
  CHECK(calls == std::vector<std::string>{"a", "b", "b"});
  w.remove_hook(b);
  w.remove_hook(b);  // removing twice is harmless
  sum(w).backward();
  CHECK(calls.size() == 3);
  CHECK(values(w.grad()) == std::vector<double>{3, 3});

  // A hook may register another one while it runs; the new one fires next time.
  int late = 0;
  w.register_post_accumulate_grad_hook([&](Tensor& t) {
    if (late == 0) t.register_post_accumulate_grad_hook([&](Tensor&) { late += 10; });
    late += 1;
  });
  sum(w).backward();
  CHECK(late == 1);
  sum(w).backward();
  CHECK(late == 12);
}

TEST_CASE("post-accumulate-grad hooks only on leaves that require grad",
          "[runtime][autograd][hooks]") {
  Tensor x = leaf({1}, {1});
  Tensor y = mul(x, 2.0);
  CHECK_THROWS_WITH(y.register_post_accumulate_grad_hook([](Tensor&) {}), Contains("leaf"));
  Tensor c = Tensor::ones({1});
  CHECK_THROWS_WITH(c.register_post_accumulate_grad_hook([](Tensor&) {}), Contains("require grad"));
}

TEST_CASE("post-accumulate-grad hooks fire last layer first in an MLP",
          "[runtime][autograd][hooks]") {
  Generator g(3);
  const std::vector<int64_t> widths = {5, 8, 7, 6, 3};
  std::vector<Tensor> weights, biases;
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    Tensor wt = Tensor::empty({widths[l + 1], widths[l]});
    kaiming_uniform_(wt, std::sqrt(5.0), g);
    Tensor bs = Tensor::empty({widths[l + 1]});
    uniform_(bs, -0.1, 0.1, g);
    weights.push_back(wt.requires_grad_());
    biases.push_back(bs.requires_grad_());
  }
  // Records (layer, is_bias) in firing order, and checks the grad is there.
  std::vector<std::pair<int, bool>> order;
  for (size_t l = 0; l < weights.size(); ++l) {
    weights[l].register_post_accumulate_grad_hook([&order, l](Tensor& t) {
      CHECK(t.grad().defined());
      order.emplace_back(static_cast<int>(l), false);
    });
    biases[l].register_post_accumulate_grad_hook([&order, l](Tensor& t) {
      CHECK(t.grad().defined());
      order.emplace_back(static_cast<int>(l), true);
    });
  }
  Tensor x = rand({4, 5}, DType::f32, g);
  Tensor target = Tensor::from_vector<int64_t>({0, 2, 1, 2}, {4});

  for (int step = 0; step < 2; ++step) {
    order.clear();
    Tensor h = x;
    for (size_t l = 0; l < weights.size(); ++l) {
      h = linear(h, weights[l], biases[l]);
      if (l + 1 < weights.size()) h = relu(h);
    }
    cross_entropy(h, target).backward();
    REQUIRE(order.size() == 2 * weights.size());
    // Each parameter exactly once; layers in reverse order.
    for (size_t i = 0; i < order.size(); ++i) {
      INFO("step " << step << " position " << i);
      CHECK(order[i].first == static_cast<int>(weights.size() - 1 - i / 2));
    }
    CHECK(order[0].second != order[1].second);
  }
}

TEST_CASE("gradients of a small MLP match finite differences in f64", "[runtime][autograd]") {
  Generator g(5);
  Tensor w1 = randn({4, 3}, DType::f64, g).requires_grad_();
  Tensor b1 = randn({4}, DType::f64, g).requires_grad_();
  Tensor w2 = randn({2, 4}, DType::f64, g).requires_grad_();
  Tensor x = randn({5, 3}, DType::f64, g);
  Tensor target = Tensor::from_vector<int64_t>({0, 1, 1, 0, 1}, {5});
  auto loss_of = [&] { return cross_entropy(linear(tanh(linear(x, w1, b1)), w2), target); };
  loss_of().backward();
  const double eps = 1e-6;
  for (Tensor* p : {&w1, &b1, &w2}) {
    Tensor analytic = p->grad().clone();
    double* data = p->detach().data_ptr<double>();
    for (int64_t j = 0; j < p->numel(); ++j) {
      NoGradGuard no_grad;
      const double orig = data[j];
      data[j] = orig + eps;
      const double up = loss_of().item();
      data[j] = orig - eps;
      const double down = loss_of().item();
      data[j] = orig;
      CHECK(analytic.to_vector<double>()[j] == Approx((up - down) / (2 * eps)).margin(1e-7));
    }
  }
}
