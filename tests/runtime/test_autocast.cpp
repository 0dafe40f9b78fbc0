// Autocast: each policy row (the dtype an op runs at under bf16 and f16,
// forward and backward), scopes (nesting, turning off, the device filter),
// the cast cache, and the CPU's 16-bit kernels against f32 math rounded once.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/autograd/checkpoint.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/autograd/rebind.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/random.h"
#include "lockstep/runtime/tensor.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using Catch::Contains;
using lockstep::testing::bitwise_equal;

namespace {

Tensor leaf(const Shape& shape, uint64_t seed, DType dtype = DType::f32) {
  Generator g(seed);
  return randn(shape, DType::f32, g).to(dtype).requires_grad_();
}

struct Row {
  const char* op;
  DType expect;  // kLow: the scope's dtype
  std::function<Tensor(const std::vector<Tensor>&)> run;
  std::vector<Shape> shapes;
};
constexpr DType kLow = DType::u8;  // placeholder: "the scope's dtype"

std::vector<Row> policy_rows() {
  const Tensor labels = Tensor::from_vector<int64_t>({0, 2, 1, 2}, {4});
  return {
      {"matmul", kLow, [](auto& in) { return matmul(in[0], in[1]); }, {{4, 6}, {6, 3}}},
      {"linear", kLow, [](auto& in) { return linear(in[0], in[1], in[2]); }, {{4, 6}, {3, 6}, {3}}},
      {"conv2d", kLow, [](auto& in) { return conv2d(in[0], in[1], in[2], {.padding = {1, 1}}); },
       {{2, 3, 5, 5}, {4, 3, 3, 3}, {4}}},
      {"scaled_dot_product_attention", kLow,
       [](auto& in) { return scaled_dot_product_attention(in[0], in[1], in[2], {.causal = true}); },
       {{2, 5, 4}, {2, 5, 4}, {2, 5, 4}}},
      {"softmax", DType::f32, [](auto& in) { return softmax(in[0], 1); }, {{4, 5}}},
      {"log_softmax", DType::f32, [](auto& in) { return log_softmax(in[0], 1); }, {{4, 5}}},
      {"cross_entropy", DType::f32, [labels](auto& in) { return cross_entropy(in[0], labels); },
       {{4, 3}}},
      {"mse_loss", DType::f32, [](auto& in) { return mse_loss(in[0], in[1]); }, {{4, 3}, {4, 3}}},
      {"layer_norm", DType::f32, [](auto& in) { return layer_norm(in[0], {5}, in[1], in[2]); },
       {{4, 5}, {5}, {5}}},
      {"batch_norm", DType::f32,
       [](auto& in) {
         return batch_norm(in[0], in[1], in[2], Tensor::zeros({3}), Tensor::ones({3}), true);
       },
       {{4, 3, 2}, {3}, {3}}},
      {"sum", DType::f32, [](auto& in) { return sum(in[0], {1}); }, {{4, 5}}},
      {"mean", DType::f32, [](auto& in) { return mean(in[0]); }, {{4, 5}}},
      {"exp", DType::f32, [](auto& in) { return exp(in[0]); }, {{4, 5}}},
      {"log", DType::f32, [](auto& in) { return log(abs(in[0])); }, {{4, 5}}},
      {"pow", DType::f32, [](auto& in) { return pow(in[0], 3.0); }, {{4, 5}}},
  };
}

}  // namespace

TEST_CASE("autocast: each op runs at its policy's dtype, and gradients reach f32 leaves as f32",
          "[autocast]") {
  for (DType low : {DType::bf16, DType::f16}) {
    for (const Row& row : policy_rows()) {
      INFO(row.op << " under " << dtype_name(low));
      // The lower rows get f32 inputs (parameters, an f32 activation); the f32
      // rows get theirs in the scope's dtype, as from a low-precision producer.
      const bool lower = row.expect == kLow;
      const DType at = lower ? low : DType::f32;
      auto inputs = [&](std::vector<Tensor>& leaves) {
        std::vector<Tensor> src;
        for (size_t i = 0; i < row.shapes.size(); ++i) {
          leaves.push_back(leaf(row.shapes[i], 10 + i));
          src.push_back(lower ? leaves.back() : leaves.back().to(low));
        }
        return src;
      };
      std::vector<Tensor> in;
      const std::vector<Tensor> src = inputs(in);
      Tensor out;
      {
        auto amp = autocast({.dtype = low});
        out = row.run(src);
      }
      CHECK(out.dtype() == at);
      sum(out.to(DType::f32)).backward();
      for (const Tensor& t : in) {
        REQUIRE(t.grad().defined());
        CHECK(t.grad().dtype() == DType::f32);
      }

      // The same computation spelled out, without autocast: the inputs cast
      // to the op's dtype, the op run there. Forward and backward agree bit
      // for bit, i.e. backward ran at the dtype the forward ran at.
      std::vector<Tensor> ref_in, ref_cast;
      for (const Tensor& t : inputs(ref_in)) ref_cast.push_back(t.to(at));
      Tensor ref = row.run(ref_cast);
      CHECK(bitwise_equal(out, ref));
      sum(ref.to(DType::f32)).backward();
      for (size_t i = 0; i < in.size(); ++i) CHECK(bitwise_equal(in[i].grad(), ref_in[i].grad()));
    }
  }
}

TEST_CASE("autocast: an f32 row takes a low-precision input to f32", "[autocast]") {
  Tensor x = leaf({4, 5}, 1, DType::bf16);
  auto amp = autocast({.dtype = DType::bf16});
  CHECK(softmax(x, 1).dtype() == DType::f32);
  CHECK(layer_norm(x, {5}).dtype() == DType::f32);
  CHECK(sum(x).dtype() == DType::f32);
  // In f32 as torch.autocast: an f16 exp overflowed to inf from 11.1 on.
  {
    auto half = autocast({.dtype = DType::f16});
    const Tensor big = Tensor::full({2}, 12.0, DType::f16);
    CHECK(exp(big).to_vector<float>() == std::vector<float>(2, std::exp(12.0f)));
    CHECK(pow(big, 5.0).dtype() == DType::f32);
    CHECK(log(big).dtype() == DType::f32);
  }
  // Elementwise ops take the widest input; unary ones keep theirs.
  CHECK(add(x, leaf({4, 5}, 2)).dtype() == DType::f32);
  CHECK(relu(x).dtype() == DType::bf16);
  CHECK(gelu(x).dtype() == DType::bf16);
  CHECK(mul(x, 0.5).dtype() == DType::bf16);
}

TEST_CASE("autocast: cat takes its widest floating input, as PyTorch's promote list",
          "[autocast]") {
  // cat refuses mixed dtypes; a bf16 linear output beside an f32 tensor threw.
  Tensor x = leaf({2, 4}, 1), w = leaf({3, 4}, 2), skip = leaf({2, 3}, 3);
  Tensor out;
  {
    auto amp = autocast({.dtype = DType::bf16});
    Tensor h = linear(x, w);
    REQUIRE(h.dtype() == DType::bf16);
    out = cat({h, skip}, 1);
    CHECK(cat({h, h}, 0).dtype() == DType::bf16);  // one dtype: as it is
    CHECK(cat({h, Tensor::ones({2, 3}, DType::f16)}, 0).dtype() == DType::f32);
    CHECK(cat({h, Tensor::ones({2, 3}, DType::f64)}, 0).dtype() == DType::f64);
    CHECK_THROWS_WITH(cat({h, Tensor::arange(3).reshape({1, 3})}, 0),
                      Contains("tensor 1 is i64 but tensor 0 is bf16"));
  }
  CHECK(out.dtype() == DType::f32);
  sum(out).backward();
  Tensor xr = leaf({2, 4}, 1), wr = leaf({3, 4}, 2), skipr = leaf({2, 3}, 3);
  Tensor hr = linear(xr.to(DType::bf16), wr.to(DType::bf16)).to(DType::f32);
  sum(cat({hr, skipr}, 1)).backward();
  CHECK(bitwise_equal(out, cat({hr, skipr}, 1)));
  CHECK(bitwise_equal(w.grad(), wr.grad()));
  CHECK(bitwise_equal(skip.grad(), skipr.grad()));
  CHECK(w.grad().dtype() == DType::f32);
}

TEST_CASE("autocast: scopes nest, turn off, filter by device, and end", "[autocast]") {
  Tensor a = leaf({3, 4}, 1), b = leaf({4, 2}, 2);
  CHECK(matmul(a, b).dtype() == DType::f32);  // off by default
  {
    auto outer = autocast({.dtype = DType::bf16});
    CHECK(matmul(a, b).dtype() == DType::bf16);
    {
      auto inner = autocast({.dtype = DType::f16});
      CHECK(matmul(a, b).dtype() == DType::f16);
      {
        auto off = autocast({.enabled = false});
        CHECK(matmul(a, b).dtype() == DType::f32);
        CHECK_FALSE(autocast_state().enabled);
      }
      CHECK(matmul(a, b).dtype() == DType::f16);
    }
    CHECK(matmul(a, b).dtype() == DType::bf16);
  }
  CHECK(matmul(a, b).dtype() == DType::f32);
  {
    auto cuda_only = autocast({.dtype = DType::bf16, .device = DeviceType::CUDA});
    CHECK(matmul(a, b).dtype() == DType::f32);  // these tensors are on the CPU
    CHECK(autocast_state().applies_to(Device::cuda(0)));
    CHECK_FALSE(autocast_state().applies_to(Device::cpu()));
  }
  {
    auto cpu = autocast({.dtype = DType::bf16, .device = DeviceType::CPU});
    CHECK(matmul(a, b).dtype() == DType::bf16);
  }
}

TEST_CASE("autocast: f64 and integer tensors are never cast", "[autocast]") {
  Tensor a = leaf({3, 4}, 1, DType::f64), b = leaf({4, 2}, 2, DType::f64);
  auto amp = autocast({.dtype = DType::bf16});
  CHECK(matmul(a, b).dtype() == DType::f64);
  CHECK(softmax(a, 1).dtype() == DType::f64);
  CHECK(sum(Tensor::arange(5)).dtype() == DType::i64);
}

TEST_CASE("autocast: a parameter is cast once per outermost scope", "[autocast]") {
  Tensor w = leaf({3, 4}, 1);
  Tensor x = mul(leaf({2, 4}, 2), 1.0);  // an activation, not a parameter
  using detail::autocast_inputs;
  using detail::CastPolicy;
  const void* first = nullptr;
  {
    auto amp = autocast({.dtype = DType::bf16});
    auto c1 = autocast_inputs(CastPolicy::lower, {x, w});
    auto c2 = autocast_inputs(CastPolicy::lower, {x, w});
    REQUIRE(c1);
    REQUIRE(c2);
    first = (*c1)[1].storage().get();
    CHECK((*c2)[1].storage().get() == first);          // the weight: cached
    CHECK((*c1)[0].storage() != (*c2)[0].storage());   // x is not a parameter: cast each time
    {
      auto nested = autocast({.dtype = DType::bf16});
      CHECK((*autocast_inputs(CastPolicy::lower, {w}))[0].storage().get() == first);
    }
    CHECK((*autocast_inputs(CastPolicy::lower, {w}))[0].storage().get() == first);
    {
      NoGradGuard no_grad;  // w.data changed in place: its cast is redone
      w.add_(Tensor::ones({3, 4}));
    }
    Tensor again = (*autocast_inputs(CastPolicy::lower, {w}))[0];
    CHECK(again.storage().get() != first);
    CHECK(bitwise_equal(again, w.detach().to(DType::bf16)));
  }
  auto next = autocast({.dtype = DType::bf16});
  Tensor fresh = (*autocast_inputs(CastPolicy::lower, {w}))[0];
  CHECK(fresh.defined());
  CHECK(fresh.dtype() == DType::bf16);
}

TEST_CASE("autocast: a parameter rebound to a new storage (Module::to) is cast again",
          "[autocast]") {
  // The new storage may take the freed one's address at the same version:
  // before, that found the old values' cast.
  Tensor w = leaf({3, 4}, 1);
  auto amp = autocast({.dtype = DType::bf16});
  using detail::autocast_inputs;
  using detail::CastPolicy;
  CHECK(autocast_inputs(CastPolicy::lower, {w}));  // cached
  for (int round = 0; round < 4; ++round) {
    NoGradGuard no_grad;
    rebind(w, w.detach().to(DType::f64));  // frees the f32 storage
    rebind(w, mul(w.detach(), 2.0).to(DType::f32));  // a new one of that size
    CHECK(bitwise_equal((*autocast_inputs(CastPolicy::lower, {w}))[0],
                        w.detach().to(DType::bf16)));
  }
}

TEST_CASE("autocast: one forward casts a shared weight once and sums its gradient in f32",
          "[autocast]") {
  Tensor w = leaf({4, 4}, 1);
  Tensor x = leaf({3, 4}, 2);
  Tensor out;
  {
    auto amp = autocast({.dtype = DType::bf16});
    out = linear(linear(x, w), w);  // the same weight twice, as a tied one
  }
  sum(out.to(DType::f32)).backward();
  Tensor wr = leaf({4, 4}, 1), xr = leaf({3, 4}, 2);
  Tensor wc = wr.to(DType::bf16);
  sum(linear(linear(xr.to(DType::bf16), wc), wc).to(DType::f32)).backward();
  CHECK(bitwise_equal(w.grad(), wr.grad()));
  CHECK(w.grad().dtype() == DType::f32);
}

TEST_CASE("autocast: backward called inside the scope runs as outside it", "[autocast]") {
  auto grads = [](bool inside) {
    Tensor x = leaf({4, 6}, 1), w = leaf({3, 6}, 2);
    auto amp = autocast({.dtype = DType::bf16});
    Tensor loss = sum(relu(linear(x, w)));
    if (inside) {
      loss.backward();
      return w.grad();
    }
    auto off = autocast({.enabled = false});
    loss.backward();
    return w.grad();
  };
  CHECK(bitwise_equal(grads(true), grads(false)));
}

TEST_CASE("autocast: two leaves over one storage each get their own cast and gradient",
          "[autocast]") {
  // The cache keyed on storage alone gave w2 w's cast, so w2's gradient went to w.
  Tensor x = leaf({2, 4}, 1), w = leaf({3, 4}, 2);
  Tensor w2 = w.detach().requires_grad_();
  auto amp = autocast({.dtype = DType::bf16});
  Tensor a = sum(linear(x, w));
  sum(linear(x, w2)).backward();
  REQUIRE(w2.grad().defined());
  CHECK_FALSE(w.grad().defined());
  a.backward();
  CHECK(bitwise_equal(w.grad(), w2.grad()));
}

TEST_CASE("autocast: a checkpoint's recomputation leaves no cast behind in the scope",
          "[autocast]") {
  // Casts made while backward recomputed a region were cached; the next forward
  // in the scope reused them and its backward threw ("not differentiable").
  Tensor x = leaf({2, 4}, 1), w = leaf({3, 4}, 2);
  auto region = [&](const Tensor& in) { return relu(linear(in, w)); };
  Tensor first;
  {
    auto amp = autocast({.dtype = DType::bf16});
    first = sum(checkpoint(region, x));
  }
  auto amp = autocast({.dtype = DType::bf16});
  first.backward();
  w.set_grad(Tensor());
  sum(linear(x, w)).backward();
  Tensor wr = leaf({3, 4}, 2), xr = leaf({2, 4}, 1);
  sum(linear(xr, wr)).backward();
  CHECK(bitwise_equal(w.grad(), wr.grad()));
}

TEST_CASE("autocast: bad options are refused", "[autocast]") {
  CHECK_THROWS_WITH(autocast({.dtype = DType::f32}), Contains("use DType::bf16 or DType::f16"));
  CHECK_THROWS_WITH(autocast({.dtype = DType::i64}), Contains("not a lower-precision float"));
  CHECK_FALSE(autocast_state().enabled);
}

TEST_CASE("CPU bf16 and f16 kernels: f32 math on the stored values, rounded once", "[autocast]") {
  for (DType low : {DType::bf16, DType::f16}) {
    INFO(dtype_name(low));
    Generator g(7);
    Tensor a = randn({5, 7}, DType::f32, g).to(low), b = randn({7, 3}, DType::f32, g).to(low);
    Tensor c = randn({5, 7}, DType::f32, g).to(low);
    const Tensor a32 = a.to(DType::f32), b32 = b.to(DType::f32), c32 = c.to(DType::f32);
    CHECK(bitwise_equal(matmul(a, b), matmul(a32, b32).to(low)));
    CHECK(bitwise_equal(add(a, c), add(a32, c32).to(low)));
    CHECK(bitwise_equal(mul(a, c), mul(a32, c32).to(low)));
    CHECK(bitwise_equal(gelu(a), gelu(a32).to(low)));
    CHECK(bitwise_equal(relu(a), relu(a32).to(low)));
    CHECK(bitwise_equal(mul(a, 0.1), mul(a32, 0.1).to(low)));  // the scalar in float, not rounded
    CHECK(bitwise_equal(sum(a, {0}), sum(a32, {0}).to(low)));
    CHECK(bitwise_equal(max(a, 1), max(a32, 1).to(low)));
    CHECK(bitwise_equal(argmax(a, 1), argmax(a32, 1)));
    CHECK(bitwise_equal(softmax(a, 1), softmax(a32, 1).to(low)));
    Tensor sdpa = scaled_dot_product_attention(a.view({1, 5, 7}), c.view({1, 5, 7}),
                                               c.view({1, 5, 7}), {.causal = true});
    Tensor sdpa32 = scaled_dot_product_attention(a32.view({1, 5, 7}), c32.view({1, 5, 7}),
                                                 c32.view({1, 5, 7}), {.causal = true});
    CHECK(bitwise_equal(sdpa, sdpa32.to(low)));
    Tensor img = randn({2, 3, 6, 6}, DType::f32, g).to(low);
    CHECK(bitwise_equal(max_pool2d(img, {.kernel = {2, 2}}),
                    max_pool2d(img.to(DType::f32), {.kernel = {2, 2}}).to(low)));
    Tensor dropped = dropout(a, 0.5, true, g);
    CHECK(dropped.dtype() == low);
  }
}
