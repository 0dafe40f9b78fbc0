// Modules with several inputs and outputs (nn::Values): the call itself, its
// errors, and DDP, DataParallel and SyncBatchNorm conversion passing it through.
#include <catch2/catch.hpp>

#include "lockstep/nn/activation.h"
#include "lockstep/nn/container.h"
#include "lockstep/nn/data_parallel.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/loss.h"
#include "lockstep/nn/normalization.h"
#include "lockstep/nn/sync_batch_norm.h"
#include "lockstep/nn/values.h"
#include "nn/ddp/ddp_fixture.h"
#include "support/test_util.h"

namespace lt = lockstep::testing;
namespace nn = lockstep::nn;
namespace lr = lockstep::runtime;
using lockstep::runtime::Device;
using lockstep::runtime::Tensor;

namespace {

// x [N, 12] and optional targets [N] in, a scale factor and a flag:
// returns {logits [N, 5], aux [N, 1], loss (when targets are given) or none}.
// `aux` is reached only through the second output.
class Scorer : public nn::Module {
 public:
  explicit Scorer(uint64_t seed) {
    lr::Generator g(seed);
    trunk = std::make_shared<nn::Linear>(12, 8, true, g);
    body = register_module(
        "body", std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
                    trunk, std::make_shared<nn::BatchNorm1d>(8), std::make_shared<nn::ReLU>()}));
    head = register_module("head", std::make_shared<nn::Linear>(8, 5, true, g));
    aux = register_module("aux", std::make_shared<nn::Linear>(8, 1, true, g));
  }
  nn::Values forward_values(const nn::Values& in) override {
    Tensor h = (*body)(in.tensor(0));
    Tensor logits = lr::mul((*head)(h), in.number(2));
    Tensor a = in.flag(3) ? (*aux)(h) : lr::mul(h.slice(1, 0, 1), 0.0);
    const Tensor targets = in.optional_tensor(1);
    nn::Value loss;
    if (targets.defined()) loss = lr::cross_entropy(logits, targets);
    return {logits, a, loss};
  }
  std::string type_name() const override { return "Scorer"; }
  std::shared_ptr<nn::Module> replicate() const override {
    auto copy = std::make_shared<Scorer>(0);
    return copy;
  }
  std::shared_ptr<nn::Sequential> body;  // trunk, BatchNorm1d, ReLU
  std::shared_ptr<nn::Linear> trunk, head, aux;
};

class NoForward : public nn::Module {
 public:
  std::string type_name() const override { return "NoForward"; }
};

// Only forward_values, one tensor in and one out.
class Doubler : public nn::Module {
 public:
  nn::Values forward_values(const nn::Values& in) override { return {lr::mul(in.tensor(0), 2.0)}; }
  std::string type_name() const override { return "Doubler"; }
};

std::string grad_mismatch(nn::Module& a, nn::Module& b, double tol = 1e-5) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    if (auto m = lt::mismatch(pa[i].first, pa[i].second.grad(), pb[i].second.grad(), tol); !m.empty())
      return m;
  }
  return "";
}

}  // namespace

TEST_CASE("Values: typed access names the position and what is there", "[nn][values]") {
  const Tensor x = Tensor::zeros({2, 3});
  const nn::Values v{x, nn::Value{}, true, int64_t{4}, 0.5, std::string("gelu")};
  CHECK(v.size() == 6);
  CHECK(v.is_tensor(0));
  CHECK_FALSE(v.is_tensor(1));
  CHECK(v.flag(2));
  CHECK(v.integer(3) == 4);
  CHECK(v.number(3) == 4.0);
  CHECK(v.number(4) == 0.5);
  CHECK(v.text(5) == "gelu");
  CHECK_FALSE(v.optional_tensor(1).defined());
  CHECK_FALSE(v.optional_tensor(9).defined());
  CHECK(v.tensors().size() == 1);
  CHECK_THAT(lt::error_of([&] { (void)v.tensor(2); }),
             Catch::Contains("expected a tensor at position 2 but it holds the flag true"));
  CHECK_THAT(lt::error_of([&] { (void)v.flag(0); }),
             Catch::Contains("position 0 but it holds a tensor [2, 3] f32"));
  CHECK_THAT(lt::error_of([&] { (void)v.integer(7); }),
             Catch::Contains("position 7 but only 6 values were given"));
  CHECK_THAT(lt::error_of([&] { (void)v.optional_tensor(2); }), Catch::Contains("a tensor or none"));
  // Plain indexing too: a lockstep::Error, as every other access.
  CHECK(nn::describe(v[5]) == "the text \"gelu\"");
  CHECK_THAT(lt::error_of([&] { (void)v[6]; }),
             Catch::Equals("expected a value at position 6 but only 6 values were given"));
}

TEST_CASE("Module: either forward serves both calls; neither, or a mismatched call, is named",
          "[nn][values]") {
  const Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  nn::Linear linear(3, 2);
  const nn::Values one = linear.forward_values({x});
  REQUIRE(one.size() == 1);
  CHECK(lt::bitwise_equal(one.tensor(0), linear(x)));

  Doubler doubler;
  lt::check_close(doubler(x), {2, 4, 6});

  NoForward none;
  CHECK_THAT(lt::error_of([&] { none(x); }), Catch::Contains("NoForward: has no forward()"));
  CHECK_THAT(lt::error_of([&] { none.forward_values({x}); }),
             Catch::Contains("NoForward: has no forward()"));
  CHECK_THAT(lt::error_of([&] { linear.forward_values({x, x}); }),
             Catch::Contains("Linear: takes one tensor") && Catch::Contains("called with 2 values"));

  Scorer scorer(1);
  const Tensor batch = lr::randn({4, 12});
  CHECK_THAT(lt::error_of([&] { scorer(batch); }),
             Catch::Contains("expected a number at position 2 but only 1 values were given"));
  nn::Sequential seq{std::make_shared<Scorer>(1)};
  CHECK_THAT(lt::error_of([&] { seq.forward_values({batch, nn::Value{}, 1.0, true}).tensor(2); }),
             Catch::Contains("position 2 but it holds none"));
}

TEST_CASE("Sequential: forward_values hands each child's outputs to the next", "[nn][values]") {
  auto scorer = std::make_shared<Scorer>(2);
  const Tensor x = lr::randn({4, 12});
  // Scorer's three outputs go to Doubler, which reads the first.
  nn::Sequential chain{scorer, std::make_shared<Doubler>()};
  const nn::Values out = chain.forward_values({x, nn::Value{}, 1.0, true});
  REQUIRE(out.size() == 1);
  CHECK(lt::bitwise_equal(out.tensor(0),
                          lr::mul(scorer->forward_values({x, nn::Value{}, 1.0, true}).tensor(0), 2.0)));
  // Doubler's one output is too few for a Scorer after it.
  nn::Sequential wrong{std::make_shared<Doubler>(), scorer};
  CHECK_THAT(lt::error_of([&] { wrong.forward_values({x, nn::Value{}, 1.0, true}); }),
             Catch::Contains("expected a number at position 2 but only 1 values were given"));
}

TEST_CASE("DataParallel: several inputs split, non-tensors copied, outputs gathered; "
          "gradients equal one device's",
          "[nn][values][data_parallel]") {
  const auto batch = lt::global_batch(8, 3);
  auto model = std::make_shared<Scorer>(5);
  nn::DataParallel dp(model, {Device::cpu(), Device::cpu()});
  const nn::Values out = dp.forward_values({batch.x, batch.y, 0.5, true});
  REQUIRE(out.size() == 3);
  CHECK(out.tensor(0).shape() == lr::Shape{8, 5});
  CHECK(out.tensor(1).shape() == lr::Shape{8, 1});
  // One loss per replica, as PyTorch's gather of scalars.
  REQUIRE(out.tensor(2).shape() == lr::Shape{2});
  lr::add(lr::mean(out.tensor(2)), lr::mean(out.tensor(1))).backward();

  // One device on the same two chunks (BatchNorm sees each chunk alone).
  auto alone = std::make_shared<Scorer>(5);
  Tensor loss_sum, aux_sum;
  for (int r = 0; r < 2; ++r) {
    const auto half = lt::shard(batch, r, 2);
    const nn::Values o = alone->forward_values({half.x, half.y, 0.5, true});
    CHECK(lt::mismatch("logits", out.tensor(0).slice(0, 4 * r, 4 * r + 4), o.tensor(0), 1e-6) == "");
    Tensor term = lr::add(lr::mul(o.tensor(2), 0.5), lr::mul(lr::sum(o.tensor(1)), 1.0 / 8));
    loss_sum = loss_sum.defined() ? lr::add(loss_sum, term) : term;
  }
  loss_sum.backward();
  CHECK(grad_mismatch(*model, *alone) == "");

  // Without targets the loss is none, passed through from replica 0.
  const nn::Values no_loss = dp.forward_values({batch.x, nn::Value{}, 0.5, false});
  CHECK(std::holds_alternative<std::monostate>(no_loss[2]));
  CHECK_THAT(lt::error_of([&] { dp.forward_values({batch.x, batch.y.slice(0, 0, 6), 0.5, true}); }),
             Catch::Contains("input 1 has 6 rows along dim 0 but input 0 has 8"));
  CHECK_THAT(lt::error_of([&] { dp.forward_values({1.0, true}); }),
             Catch::Contains("none of the 2 inputs is a tensor"));
}

TEST_CASE("DDP: forward_values passes through; find_unused_parameters walks from every output",
          "[nn][values][ddp]") {
  const auto batch = lt::global_batch(8, 6);
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    auto model = std::make_shared<Scorer>(7);
    nn::DistributedDataParallel ddp(model, group, nn::DdpOptions{.find_unused_parameters = true});
    const auto local = lt::shard(batch, r, 2);
    // `aux` is reached only from output 1: found used, averaged once.
    nn::Values out = ddp.forward_values({local.x, local.y, 1.0, true});
    lr::add(out.tensor(2), lr::mean(out.tensor(1))).backward();
    if (!model->aux->weight.grad().defined()) return "aux got no gradient";
    // Expected: the mean of both ranks' local gradients.
    Tensor expected;
    for (int k = 0; k < 2; ++k) {
      auto alone = std::make_shared<Scorer>(7);
      const auto part = lt::shard(batch, k, 2);
      nn::Values o = alone->forward_values({part.x, part.y, 1.0, true});
      lr::add(o.tensor(2), lr::mean(o.tensor(1))).backward();
      Tensor g = lr::mul(alone->aux->weight.grad(), 0.5);
      expected = expected.defined() ? lr::add(expected, g) : g;
    }
    if (auto m = lt::mismatch("aux.weight.grad", model->aux->weight.grad(), expected, 1e-5);
        !m.empty())
      return m;
    // With the flag off `aux` is unused on every rank and keeps its gradient.
    ddp.zero_grad();
    out = ddp.forward_values({local.x, local.y, 1.0, false});
    lr::add(out.tensor(2), lr::mean(out.tensor(1))).backward();
    if (model->aux->weight.grad().defined()) return "unused aux got a gradient";
    return "";
  });
  for (const auto& p : problems) CHECK(p == "");
}

TEST_CASE("convert_sync_batchnorm: a module with several inputs keeps its call", "[nn][values][sync_bn]") {
  const auto batch = lt::global_batch(8, 8);
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    auto model = std::make_shared<Scorer>(9);
    auto converted = nn::convert_sync_batchnorm(model, group);
    const std::string norm = converted->named_modules()[3].second->type_name();
    if (norm != "SyncBatchNorm") return "body.1 was not converted: it is a " + norm;
    nn::DistributedDataParallel ddp(converted, group);
    const auto local = lt::shard(batch, r, 2);
    const nn::Values out = ddp.forward_values({local.x, local.y, 1.0, true});
    lr::add(out.tensor(2), lr::mean(out.tensor(1))).backward();
    return model->trunk->weight.grad().defined() ? "" : "trunk got no gradient";
  });
  for (const auto& p : problems) CHECK(p == "");
}

TEST_CASE("Loss modules take {input, target} through forward_values", "[nn][values][loss]") {
  lr::Generator g(2);
  const Tensor logits = lr::randn({4, 3}, lr::DType::f32, g);
  const Tensor target = Tensor::from_vector<int64_t>({0, 2, 1, 1}, {4});
  nn::CrossEntropyLoss ce({.label_smoothing = 0.1});
  const nn::Values out = ce.forward_values({logits, target});
  REQUIRE(out.size() == 1);
  CHECK(lt::bitwise_equal(out.tensor(0), ce(logits, target)));

  nn::MSELoss mse;
  const Tensor y = lr::randn({4, 3}, lr::DType::f32, g);
  CHECK(lt::bitwise_equal(mse.forward_values({logits, y}).tensor(0), mse(logits, y)));

  CHECK_THAT(lt::error_of([&] { ce.forward_values({logits}); }),
             Catch::Contains("CrossEntropyLoss takes two tensors, (input, target), but was called "
                             "with 1 values (a tensor [4, 3] f32)"));
  CHECK_THAT(lt::error_of([&] { mse.forward_values({logits, 2.0}); }),
             Catch::Contains("MSELoss takes two tensors"));
  CHECK_THAT(lt::error_of([&] { ce.forward(logits); }), Catch::Contains("takes (input, target)"));
}
