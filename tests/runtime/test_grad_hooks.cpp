// Tensor::register_hook and autograd::grad, against PyTorch 1.13's numbers
// (torch.Tensor.register_hook, torch.autograd.grad) on the same inputs.
#include <catch2/catch.hpp>

#include <vector>

#include "lockstep/runtime/autograd/grad.h"
#include "lockstep/runtime/ops.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Matchers::Contains;

namespace {
Tensor vec(const std::vector<float>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
}
}  // namespace

TEST_CASE("register_hook on a leaf changes what is accumulated, once per backward", "[autograd]") {
  Tensor x = vec({1, 2, 3}).requires_grad_();
  std::vector<Tensor> seen;
  x.register_hook([&](const Tensor& g) {
    seen.push_back(g.clone());
    return mul(g, Tensor::scalar(2));
  });
  // Used twice: the hook sees the sum, 2x + 3, once.
  sum(add(mul(x, x), mul(x, Tensor::scalar(3)))).backward();
  REQUIRE(seen.size() == 1);
  check_close(seen[0], {5, 7, 9});
  check_close(x.grad(), {10, 14, 18});
}

TEST_CASE("register_hook on a computed tensor changes what flows back; hooks chain in order",
          "[autograd]") {
  Tensor x = vec({1, 2}).requires_grad_();
  Tensor h = mul(x, Tensor::scalar(3));
  h.register_hook([](const Tensor& g) { return mul(g, Tensor::scalar(2)); });
  h.register_hook([](const Tensor& g) { return add(g, Tensor::ones(g.shape())); });
  int observed = 0;
  h.register_hook([&](const Tensor&) {
    ++observed;
    return Tensor();  // keeps the gradient
  });
  sum(mul(h, h)).backward();
  REQUIRE(observed == 1);
  check_close(x.grad(), {39, 75});
  REQUIRE_FALSE(h.grad().defined());
}

TEST_CASE("remove_hook stops a register_hook hook, on leaves and computed tensors",
          "[autograd]") {
  Tensor x = vec({1, 2}).requires_grad_();
  auto times_ten = [](const Tensor& g) { return mul(g, Tensor::scalar(10)); };
  const int64_t on_leaf = x.register_hook(times_ten);
  Tensor h = mul(x, Tensor::scalar(3));
  const int64_t on_h = h.register_hook(times_ten);
  x.remove_hook(on_leaf);
  h.remove_hook(on_h);
  sum(h).backward();
  check_close(x.grad(), {3, 3});
}

TEST_CASE("a register_hook hook runs before the post-accumulate hooks, which see its result",
          "[autograd]") {
  Tensor x = vec({1, 2}).requires_grad_();
  std::vector<double> at_post;
  x.register_post_accumulate_grad_hook([&](Tensor& leaf) { at_post = values(leaf.grad()); });
  x.register_hook([](const Tensor& g) { return mul(g, Tensor::scalar(0.5)); });
  sum(mul(x, Tensor::scalar(4))).backward();
  REQUIRE(at_post == std::vector<double>{2, 2});
}

TEST_CASE("register_hook refuses a tensor without grad and a hook that reshapes", "[autograd]") {
  Tensor plain = vec({1, 2});
  CHECK_THAT(error_of([&] { plain.register_hook([](const Tensor& g) { return g; }); }),
             Contains("cannot register a hook on a tensor that doesn't require gradient"));
  Tensor x = vec({1, 2}).requires_grad_();
  x.register_hook([](const Tensor&) { return Tensor::ones({3}); });
  const std::string err = error_of([&] { sum(x).backward(); });
  CHECK_THAT(err, Contains("returned a gradient of shape [3]"));
  CHECK_THAT(err, Contains("one of shape [2]"));
}

TEST_CASE("autograd::grad returns the gradients of several outputs and leaves .grad alone",
          "[autograd]") {
  Tensor x = vec({1, 2}).requires_grad_();
  Tensor w = vec({3, -1}).requires_grad_();
  int post = 0;
  w.register_post_accumulate_grad_hook([&](Tensor&) { ++post; });
  Tensor a = mul(x, w);
  Tensor b = sum(mul(x, x));
  auto g = autograd::grad({a, b}, {x, w}, {.grad_outputs = {vec({1, 10}), Tensor::scalar(2)}});
  REQUIRE(g.size() == 2);
  check_close(g[0], {7, -2});
  check_close(g[1], {1, 20});
  CHECK_FALSE(x.grad().defined());
  CHECK_FALSE(w.grad().defined());
  CHECK(post == 0);
}

TEST_CASE("autograd::grad: unused inputs are an error unless allow_unused", "[autograd]") {
  Tensor x = vec({1, 2}).requires_grad_();
  Tensor w = vec({3, -1}).requires_grad_();
  Tensor u = Tensor::ones({2}).requires_grad_();
  const std::string err = error_of([&] {
    autograd::grad({sum(mul(x, w))}, {x, u});
  });
  CHECK_THAT(err, Contains("input 1"));
  CHECK_THAT(err, Contains("allow_unused"));
  auto g = autograd::grad({sum(mul(x, w))}, {u, x}, {.allow_unused = true});
  CHECK_FALSE(g[0].defined());
  check_close(g[1], {3, -1});
  CHECK_THAT(error_of([&] { autograd::grad({sum(mul(x, w))}, {vec({1, 1})}); }),
             Contains("input 0 does not require grad"));
  CHECK_THAT(error_of([&] { autograd::grad({mul(x, w)}, {x}); }),
             Contains("only for a one-element output"));
  CHECK_THAT(error_of([&] { autograd::grad({sum(mul(x, w))}, {x}, {.create_graph = true}); }),
             Contains("create_graph=true"));
}

TEST_CASE("autograd::grad takes a computed input's gradient before its hooks, as PyTorch 1.13",
          "[autograd]") {
  // torch 1.13: a leaf's hooks do not run (no AccumulateGrad does); a
  // computed input's gradient is captured before its hooks, which still
  // change the gradient flowing past it.
  Tensor x = vec({1, 2}).requires_grad_();
  x.register_hook([](const Tensor& g) { return mul(g, Tensor::scalar(10)); });
  check_close(autograd::grad({sum(mul(x, x))}, {x})[0], {2, 4});
  Tensor h = mul(x, Tensor::scalar(3));
  h.register_hook([](const Tensor& g) { return add(g, Tensor::ones(g.shape())); });
  auto g = autograd::grad({sum(mul(h, h))}, {h, x});
  check_close(g[0], {6, 12});
  check_close(g[1], {21, 39});
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("autograd::grad frees the graph unless retain_graph, as backward", "[autograd]") {
  Tensor x = vec({1, 2}).requires_grad_();
  Tensor y = sum(mul(x, x));
  check_close(autograd::grad({y}, {x}, {.retain_graph = true})[0], {2, 4});
  check_close(autograd::grad({y}, {x})[0], {2, 4});
  CHECK_THAT(error_of([&] { autograd::grad({y}, {x}); }), Contains("second time"));
}

TEST_CASE("autograd::grad frees only the nodes it ran: backward through the rest still works",
          "[autograd]") {
  // PyTorch frees the saved tensors of the nodes a grad() pass executes; the
  // nodes below its inputs stay usable for another output's backward.
  Tensor x = vec({1, 2}).requires_grad_();
  Tensor y = mul(x, x);
  Tensor z1 = sum(mul(y, y));
  Tensor z2 = sum(mul(y, y));
  check_close(autograd::grad({z1}, {y})[0], {2, 8});  // 2y
  z2.backward();
  check_close(x.grad(), {4, 32});  // 4x^3
}
