// Activation checkpointing (runtime/autograd/checkpoint.h) on a small MLP with
// dropout: the same loss, gradients and generator state as without it, bit
// for bit, and clear errors where a recomputation cannot match its forward.
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "lockstep/nn/linear.h"
#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/autograd/checkpoint.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/random.h"
#include "support/test_util.h"

namespace nn = lockstep::nn;
namespace lr = lockstep::runtime;
using lr::Tensor;

namespace {


struct Mlp {
  lr::Generator init{3};
  nn::Linear l1{8, 16, true, init}, l2{16, 4, true, init};
  // Explicitly passed generator, besides the default one.
  lr::Generator own{11};
  Tensor forward(const Tensor& x) {
    Tensor h = lr::dropout(lr::gelu(l1.forward(x)), 0.3, true);
    h = lr::dropout(h, 0.2, true, own);
    return l2.forward(h);
  }
};

struct Run {
  Tensor loss, grad_x;
  std::vector<Tensor> grads;
  uint64_t default_offset, own_offset;
};

Run run(bool checkpointed, bool draw_between = false) {
  lr::manual_seed(5);
  Mlp m;
  lr::Generator g(9);
  Tensor x = lr::randn({6, 8}, lr::DType::f32, g).requires_grad_(true);
  const Tensor y = checkpointed
                       ? lr::checkpoint([&m](const Tensor& in) { return m.forward(in); }, x)
                       : m.forward(x);
  const Tensor loss = lr::mean(lr::mul(y, y));
  // Draws after the forward must not change what the recomputation draws.
  if (draw_between) {
    lr::default_generator().next_u32();
    m.own.next_u32();
  }
  loss.backward();
  return {loss, x.grad(), {m.l1.weight.grad(), m.l1.bias.grad(), m.l2.weight.grad(), m.l2.bias.grad()},
          lr::default_generator().offset(), m.own.offset()};
}

void check_same(const Run& a, const Run& b) {
  CHECK(lockstep::testing::bitwise_equal(a.loss, b.loss));
  CHECK(lockstep::testing::bitwise_equal(a.grad_x, b.grad_x));
  for (size_t i = 0; i < a.grads.size(); ++i) CHECK(lockstep::testing::bitwise_equal(a.grads[i], b.grads[i]));
  CHECK(a.default_offset == b.default_offset);
  CHECK(a.own_offset == b.own_offset);
}

}  // namespace

TEST_CASE("checkpoint: an MLP with dropout gives the plain loss, gradients and generator state",
          "[autograd][checkpoint]") {
  const Run plain = run(false), ckpt = run(true);
  check_same(plain, ckpt);
  CHECK(plain.default_offset > 0);
  CHECK(plain.own_offset > 0);
  // The replay does not read the generators' state at backward time.
  check_same(run(false, true), run(true, true));
}

TEST_CASE("checkpoint: several inputs and outputs; retain_graph backwards twice",
          "[autograd][checkpoint]") {
  lr::Generator g(1);
  const auto fn = [](const std::vector<Tensor>& in) {
    const Tensor p = lr::mul(in[0], in[1]);
    return std::vector<Tensor>{lr::gelu(p), lr::exp(in[1])};
  };
  Tensor a = lr::randn({5}, lr::DType::f32, g).requires_grad_(true);
  Tensor b = lr::randn({5}, lr::DType::f32, g).requires_grad_(true);
  const auto plain = fn({a, b});
  lr::add(lr::sum(plain[0]), lr::sum(plain[1])).backward({}, true);
  const Tensor ga = a.grad().clone(), gb = b.grad().clone();
  a.set_grad({});
  b.set_grad({});
  const auto ckpt = lr::checkpoint(fn, {a, b});
  CHECK(lockstep::testing::bitwise_equal(ckpt[0], plain[0]));
  const Tensor total = lr::add(lr::sum(ckpt[0]), lr::sum(ckpt[1]));
  total.backward({}, true);
  CHECK(lockstep::testing::bitwise_equal(a.grad(), ga));
  CHECK(lockstep::testing::bitwise_equal(b.grad(), gb));
  total.backward();  // the recomputed tensors were kept for it
  CHECK(lockstep::testing::bitwise_equal(a.grad(), lr::add(ga, ga)));
  CHECK_THROWS_WITH(total.backward(), Catch::Contains("backward through the graph a second time"));
}

TEST_CASE("checkpoint: without grad mode it only runs the function", "[autograd][checkpoint]") {
  lr::NoGradGuard no_grad;
  const Tensor x = Tensor::ones({3}).requires_grad_(true);
  const Tensor y = lr::checkpoint([](const Tensor& in) { return lr::mul(in, 2.0); }, x);
  CHECK(!y.requires_grad());
  CHECK(y.to_vector<float>() == std::vector<float>{2, 2, 2});
}

TEST_CASE("checkpoint: a function whose structure changes is refused in backward",
          "[autograd][checkpoint]") {
  const Tensor x = Tensor::ones({4}).requires_grad_(true);
  int calls = 0;
  const auto changing = [&calls](const Tensor& in) {
    Tensor y = lr::gelu(in);
    if (calls++ == 0) y = lr::mul(y, y);
    return y;
  };
  const Tensor out = lr::sum(lr::checkpoint(changing, x));
  CHECK_THROWS_WITH(out.backward(), Catch::Contains("checkpoint: the recomputation saved"));

  calls = 0;
  const auto reordered = [&calls](const Tensor& in) {
    return calls++ == 0 ? lr::exp(lr::gelu(in)) : lr::gelu(lr::exp(in));
  };
  CHECK_THROWS_WITH(lr::sum(lr::checkpoint(reordered, x)).backward(),
                    Catch::Contains("recorded a different graph"));

  calls = 0;
  const auto random_once = [&calls](const Tensor& in) {
    return calls++ == 0 ? lr::dropout(lr::gelu(in), 0.5, true) : lr::gelu(in);
  };
  CHECK_THROWS_WITH(lr::sum(lr::checkpoint(random_once, x)).backward(),
                    Catch::Contains("drew fewer random numbers"));
}

TEST_CASE("checkpoint: nesting, and an input changed in place, are clear errors",
          "[autograd][checkpoint]") {
  const Tensor x = Tensor::ones({4}).requires_grad_(true);
  const auto inner = [](const Tensor& in) { return lr::gelu(in); };
  CHECK_THROWS_WITH(lr::checkpoint([&](const Tensor& in) { return lr::checkpoint(inner, in); }, x),
                    Catch::Contains("do not nest"));
  CHECK(!lr::in_checkpoint());  // the failed region left nothing behind

  Tensor h = lr::mul(x, 1.0);
  const Tensor out = lr::sum(lr::checkpoint(inner, h));
  {
    lr::NoGradGuard no_grad;
    h.add_(Tensor::ones({4}));
  }
  CHECK_THROWS_WITH(out.backward(), Catch::Contains("modified in place after the region ran"));
}

TEST_CASE("checkpoint: a parameter changed in place before backward is an error, as without it",
          "[autograd][checkpoint]") {
  // The recomputation would read the new weight and return the gradient of
  // a loss the forward never computed.
  for (const bool checkpointed : {false, true}) {
    CAPTURE(checkpointed);
    Tensor w = Tensor::full({3}, 2.0).requires_grad_(true);
    Tensor x = Tensor::ones({3}).requires_grad_(true);
    const auto fn = [&w](const Tensor& in) { return lr::mul(in, w); };
    const Tensor y = checkpointed ? lr::checkpoint(fn, x) : fn(x);
    const Tensor loss = lr::sum(lr::mul(y, y));
    {
      lr::NoGradGuard no_grad;
      w.mul_(10.0);  // an optimizer step between forward and backward
    }
    CHECK_THROWS_WITH(loss.backward(), Catch::Contains("modified by an in-place operation"));
    CHECK(!x.grad().defined());
  }
  // A parameter left alone, with the activations dropped and recomputed, is
  // no error, and neither is a second backward with the graph retained.
  Tensor w = Tensor::full({3}, 2.0).requires_grad_(true);
  Tensor x = Tensor::ones({3}).requires_grad_(true);
  const Tensor y = lr::checkpoint([&w](const Tensor& in) { return lr::gelu(lr::mul(in, w)); }, x);
  const Tensor loss = lr::sum(y);
  loss.backward({}, true);
  const Tensor first = x.grad().clone();
  loss.backward();
  CHECK(lockstep::testing::bitwise_equal(x.grad(), lr::add(first, first)));
}

TEST_CASE("checkpoint: dropout from a generator the function creates replays its draws",
          "[autograd][checkpoint]") {
  // As torch.Generator().manual_seed(s) inside the function: each run makes a
  // new generator object with the same seed, so the recomputation draws the
  // forward's mask from it.
  lr::Generator g(9);
  Tensor x = lr::randn({6, 8}, lr::DType::f32, g).requires_grad_(true);
  Tensor w = lr::randn({8}, lr::DType::f32, g).requires_grad_(true);
  const auto fn = [&w](const Tensor& in) {
    lr::Generator local(77);
    return lr::dropout(lr::gelu(lr::mul(in, w)), 0.5, true, local);
  };
  lr::sum(lr::mul(fn(x), x)).backward();
  const Tensor gx = x.grad().clone(), gw = w.grad().clone();
  x.set_grad({});
  w.set_grad({});
  lr::sum(lr::mul(lr::checkpoint(fn, x), x)).backward();
  CHECK(lockstep::testing::bitwise_equal(x.grad(), gx));
  CHECK(lockstep::testing::bitwise_equal(w.grad(), gw));

  // Seeded differently in the recomputation: a clear error, not another mask.
  uint64_t seed = 1;
  const auto reseeding = [&seed](const Tensor& in) {
    lr::Generator local(seed++);
    return lr::dropout(lr::gelu(in), 0.5, true, local);
  };
  CHECK_THROWS_WITH(lr::sum(lr::checkpoint(reseeding, x)).backward(),
                    Catch::Contains("the same way each time it runs"));
}

TEST_CASE("checkpoint: a function that re-seeds a generator leaves it where the forward did",
          "[autograd][checkpoint]") {
  // As torch.manual_seed inside a checkpointed function: the recomputation
  // seeds again, and PyTorch puts the generator back afterwards. The next
  // step's dropout must not repeat this one's mask.
  struct Out {
    Tensor grad_x, next_default, next_own;
  };
  const auto run = [](bool checkpointed) {
    lr::Generator g(9), own(4);
    Tensor x = lr::randn({6, 8}, lr::DType::f32, g).requires_grad_(true);
    const auto fn = [&own](const Tensor& in) {
      lr::manual_seed(123);
      own.manual_seed(321);
      const Tensor h = lr::dropout(lr::gelu(in), 0.5, true);
      return lr::dropout(h, 0.5, true, own);
    };
    const Tensor y = checkpointed ? lr::checkpoint(fn, x) : fn(x);
    lr::sum(lr::mul(y, x)).backward();
    return Out{x.grad(), lr::rand({16}), lr::rand({16}, lr::DType::f32, own)};
  };
  const Out plain = run(false), ckpt = run(true);
  CHECK(lockstep::testing::bitwise_equal(ckpt.grad_x, plain.grad_x));
  CHECK(lockstep::testing::bitwise_equal(ckpt.next_default, plain.next_default));
  CHECK(lockstep::testing::bitwise_equal(ckpt.next_own, plain.next_own));
}

TEST_CASE("checkpoint: a parameter stepped before backward under autocast is an error",
          "[autograd][checkpoint][autocast]") {
  // Under autocast the matmul saves a bf16 copy of the weight, not the
  // weight, so without checkpointing the gradient is the forward's. The
  // recomputation would cast the stepped weight instead: refuse, rather than
  // return the gradient of a loss the forward never computed. Also where the
  // region took the cast the scope had cached for w (made by a matmul before
  // it), so that its forward cast nothing itself: that read of w went
  // unrecorded, and backward returned that wrong gradient without a word.
  for (const bool cast_before : {false, true}) {
    INFO("w cast before the region: " << cast_before);
    lr::Generator g(9);
    Tensor x = lr::randn({4, 8}, lr::DType::f32, g).requires_grad_(true);
    Tensor w = lr::randn({8, 8}, lr::DType::f32, g).requires_grad_(true);
    const auto fn = [&w](const Tensor& in) { return lr::gelu(lr::matmul(in, w)); };
    const auto loss_of = [&](bool checkpointed) {
      auto scope = lr::autocast();
      const Tensor in = cast_before ? lr::matmul(x, w) : x;
      const Tensor y = checkpointed ? lr::checkpoint(fn, in) : fn(in);
      return lr::sum(lr::mul(y, y));
    };
    // Left alone, the parameter is no error, and the gradients are the plain ones.
    loss_of(false).backward();
    const Tensor gx = x.grad().clone(), gw = w.grad().clone();
    x.set_grad({});
    w.set_grad({});
    loss_of(true).backward();
    CHECK(lockstep::testing::bitwise_equal(x.grad(), gx));
    CHECK(lockstep::testing::bitwise_equal(w.grad(), gw));
    x.set_grad({});
    w.set_grad({});

    const Tensor stepped = loss_of(true);
    {
      lr::NoGradGuard no_grad;
      w.mul_(10.0);
    }
    CHECK_THROWS_WITH(stepped.backward(), Catch::Contains("modified by an in-place operation"));
    CHECK(!x.grad().defined());
  }
}

TEST_CASE("checkpoint: a tensor the function captures, changed in place before backward, is an "
          "error",
          "[autograd][checkpoint]") {
  // `c` is neither an input nor a parameter: the function reads it from its
  // closure. The mul saves (x + c), which the recomputation would rebuild
  // from the new c, returning 2 * (x + 3) where the forward's loss has
  // gradient 2 * (x + 2).
  Tensor x = Tensor::ones({4}).requires_grad_(true);
  Tensor c = Tensor::full({4}, 2.0);
  const auto fn = [&c](const Tensor& in) {
    const Tensor h = lr::add(in, c);
    return lr::mul(h, h);
  };
  const Tensor loss = lr::sum(lr::checkpoint(fn, x));
  c.add_(Tensor::ones({4}));
  CHECK_THROWS_WITH(loss.backward(), Catch::Contains("modified by an in-place operation") &&
                                         Catch::Contains("shape [4]"));
  CHECK(!x.grad().defined());

  // Left alone it is no error; nor is an output of the region changed in
  // place afterwards that an op inside also read (nothing saved it, and the
  // recomputation makes it anew).
  Tensor d = Tensor::full({4}, 2.0);
  const auto two = [&d](const std::vector<Tensor>& in) {
    const Tensor h = lr::add(in[0], d);
    return std::vector<Tensor>{h, lr::mul(lr::exp(h), 1.0)};
  };
  Tensor x2 = Tensor::ones({4}).requires_grad_(true);
  std::vector<Tensor> outs = lr::checkpoint(two, {x2});
  {
    lr::NoGradGuard no_grad;
    outs[0].add_(Tensor::ones({4}));
  }
  lr::sum(outs[1]).backward();
  const std::vector<double> g = lockstep::testing::values(x2.grad());
  for (double v : g) CHECK(v == Approx(std::exp(3.0)));
}

TEST_CASE("checkpoint: backward inside the checkpointed function is a clear error",
          "[autograd][checkpoint]") {
  Tensor x = Tensor::ones({4}).requires_grad_(true);
  Tensor w = Tensor::full({4}, 2.0).requires_grad_(true);
  const auto fn = [&w](const Tensor& in) {
    const Tensor h = lr::mul(in, w);
    lr::sum(lr::mul(h, h)).backward();
    return h;
  };
  CHECK_THROWS_WITH(lr::checkpoint(fn, x), Catch::Contains("inside the checkpointed function"));
  CHECK(!lr::in_checkpoint());

  // A graph made outside the region: the recomputation would run its
  // backward again and add its gradients twice.
  Tensor v = Tensor::full({4}, 2.0).requires_grad_(true);
  const Tensor outside = lr::sum(lr::mul(v, v));
  const auto backward_outside = [&outside](const Tensor& in) {
    outside.backward({}, true);
    return lr::gelu(in);
  };
  CHECK_THROWS_WITH(lr::checkpoint(backward_outside, x),
                    Catch::Contains("inside the checkpointed function"));
  CHECK(!v.grad().defined());
}
