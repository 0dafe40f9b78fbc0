// nn::Module: registration order and names, state_dict save/load and its
// errors, train/eval, to(), zero_grad() and printing.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include "lockstep/models/models.h"
#include "lockstep/nn/nn.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/ops.h"
#include "support/test_util.h"

using namespace lockstep::nn;
using namespace lockstep::testing;
using Catch::Contains;

namespace {

// The module of this PyTorch code, whose names and orders the tests expect:
//   self.scale = nn.Parameter(torch.ones(1))
//   self.register_buffer("step", torch.zeros(1))
//   self.features = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU())
//   self.head = nn.Linear(4, 2)
struct Net : Module {
  explicit Net(uint64_t seed = 0) {
    Generator gen(seed);
    scale = register_parameter("scale", Tensor::ones({1}));
    register_buffer("step", Tensor::zeros({1}));
    features = register_module("features", std::make_shared<Sequential>());
    features->push_back(std::make_shared<Linear>(3, 4, true, gen));
    features->push_back(std::make_shared<BatchNorm1d>(4));
    features->push_back(std::make_shared<ReLU>());
    head = register_module("head", std::make_shared<Linear>(4, 2, true, gen));
  }
  Tensor forward(const Tensor& x) override { return (*head)((*features)(x)) * scale; }
  std::string type_name() const override { return "Net"; }

  Tensor scale;
  std::shared_ptr<Sequential> features;
  std::shared_ptr<Linear> head;
};

std::vector<std::string> names(const NamedList<Tensor>& list) {
  std::vector<std::string> out;
  for (const auto& [name, t] : list) out.push_back(name);
  return out;
}

Tensor input(uint64_t seed) {
  Generator g(seed);
  return lockstep::runtime::randn({5, 3}, DType::f32, g);
}

}  // namespace

TEST_CASE("parameters, buffers and state_dict use PyTorch's names and order", "[nn][module]") {
  Net net;
  CHECK(names(net.named_parameters()) ==
        std::vector<std::string>{"scale", "features.0.weight", "features.0.bias",
                                 "features.1.weight", "features.1.bias", "head.weight",
                                 "head.bias"});
  CHECK(names(net.named_buffers()) ==
        std::vector<std::string>{"step", "features.1.running_mean", "features.1.running_var",
                                 "features.1.num_batches_tracked"});
  // Per module: parameters, then buffers, then submodules.
  CHECK(net.state_dict().keys() ==
        std::vector<std::string>{"scale", "step", "features.0.weight", "features.0.bias",
                                 "features.1.weight", "features.1.bias",
                                 "features.1.running_mean", "features.1.running_var",
                                 "features.1.num_batches_tracked", "head.weight", "head.bias"});
  CHECK(names(net.named_parameters(/*recurse=*/false)) == std::vector<std::string>{"scale"});

  auto children = net.named_children();
  REQUIRE(children.size() == 2);
  CHECK(children[0].first == "features");
  CHECK(children[1].first == "head");
  CHECK(children[1].second.get() == net.head.get());

  std::vector<std::string> modules;
  for (const auto& [name, m] : net.named_modules()) modules.push_back(name);
  CHECK(modules ==
        std::vector<std::string>{"", "features", "features.0", "features.1", "features.2", "head"});

  // The registered tensors are the layer's own handles, not copies.
  CHECK(net.named_parameters()[5].second.is_same(net.head->weight));
  CHECK(net.head->weight.requires_grad());
  CHECK_FALSE(net.named_buffers()[0].second.requires_grad());
  CHECK(net.num_parameters() == 1 + (12 + 4) + (4 + 4) + (8 + 2));
}

TEST_CASE("registration rejects bad and duplicate names", "[nn][module]") {
  Module m;
  m.register_parameter("w", Tensor::zeros({2}));
  CHECK_THAT(error_of([&] { m.register_buffer("w", Tensor::zeros({2})); }),
             Contains("\"w\" is already registered"));
  CHECK_THAT(error_of([&] { m.register_parameter("a.b", Tensor::zeros({2})); }),
             Contains("must not contain \".\""));
  CHECK_THAT(error_of([&] { m.register_module("", std::make_shared<ReLU>()); }),
             Contains("must not be empty"));
  CHECK_THAT(error_of([&] { m.register_module<ReLU>("r", nullptr); }), Contains("is null"));
  CHECK_THAT(error_of([&] { m.forward(Tensor::zeros({1})); }),
             Contains("has no forward() of its own"));
}

TEST_CASE("a module of thousands of children, parameters and buffers refuses each name "
          "taken by any of them, and a registration refused takes no name",
          "[nn][module]") {
  const int n = 3000;
  Sequential seq;
  for (int i = 0; i < n; ++i) seq.push_back(std::make_shared<ReLU>());
  for (int i = 0; i < n; ++i) seq.register_parameter(fmt::format("p{}", i), Tensor::zeros({1}));
  for (int i = 0; i < n; ++i) seq.register_buffer(fmt::format("b{}", i), Tensor::zeros({1}));
  CHECK(seq.size() == static_cast<size_t>(n));
  CHECK(seq.named_parameters().size() == static_cast<size_t>(n));
  CHECK(seq.named_buffers().size() == static_cast<size_t>(n));
  for (const std::string taken : {"0", "2999", "p0", "p2999", "b0", "b2999"}) {
    CHECK_THAT(error_of([&] { seq.register_buffer(taken, Tensor::zeros({1})); }),
               Contains(fmt::format("\"{}\" is already registered", taken)));
    CHECK_THAT(error_of([&] { seq.register_module(taken, std::make_shared<ReLU>()); }),
               Contains(fmt::format("\"{}\" is already registered", taken)));
  }
  // Refused for another reason, each leaves its name free.
  CHECK_THAT(error_of([&] { seq.register_module<ReLU>("r", nullptr); }), Contains("is null"));
  CHECK_THAT(error_of([&] { seq.register_parameter("q", Tensor::zeros({1}, DType::i64)); }),
             Contains("only floating-point tensors can require grad"));
  CHECK_THAT(error_of([&] { seq.register_buffer("s", Tensor{}); }), Contains("undefined"));
  seq.register_module("r", std::make_shared<ReLU>());
  seq.register_parameter("q", Tensor::zeros({1}));
  seq.register_buffer("s", Tensor::zeros({1}));
  const auto last = seq.push_back(std::make_shared<ReLU>());
  CHECK(last == seq[static_cast<size_t>(n) + 1]);
}

TEST_CASE("a parameter computed from tensors that require grad is refused as in PyTorch",
          "[nn][module]") {
  // It would never get a .grad: optimizers refused it later without naming
  // the module, DDP with an error about a gradient hook.
  Module m;
  auto a = m.register_module("a", std::make_shared<Linear>(3, 2));
  CHECK_THAT(error_of([&] { m.register_parameter("w", a->weight.t()); }),
             Contains("parameter \"w\" is not a leaf tensor") && Contains("detach().clone()"));
  CHECK_THAT(error_of([&] { Linear from(a->weight * 2.0); }),
             Contains("Linear: parameter \"weight\" is not a leaf tensor"));
  CHECK(names(m.named_parameters()) == std::vector<std::string>{"a.weight", "a.bias"});
  // A copy of its own, or a value that needs no gradient, is a leaf.
  m.register_parameter("copy", a->weight.t().detach().clone());
  m.register_parameter("scaled", Tensor::ones({2}) * 0.5);
  CHECK(m.named_parameters().size() == 4);
  // An integer tensor cannot require grad: named with its module, nothing added.
  CHECK_THAT(error_of([&] { m.register_parameter("steps", Tensor::zeros({2}, lockstep::runtime::DType::i64)); }),
             Contains("Module: parameter \"steps\" is i64, and only floating-point tensors "
                      "can require grad"));
  m.register_parameter("frozen_steps", Tensor::zeros({2}, lockstep::runtime::DType::i64), false);
  CHECK(m.named_parameters().size() == 5);
}

TEST_CASE("a shared parameter is listed once but saved under every name", "[nn][module]") {
  Module m;
  auto a = m.register_module("a", std::make_shared<Linear>(2, 2));
  auto b = m.register_module("b", std::make_shared<Module>());
  b->register_parameter("tied", a->weight);
  CHECK(names(m.named_parameters()) == std::vector<std::string>{"a.weight", "a.bias"});
  CHECK(m.state_dict().keys() == std::vector<std::string>{"a.weight", "a.bias", "b.tied"});
}

TEST_CASE("state_dict round trip into a fresh model", "[nn][module]") {
  Net src(1), dst(2);
  src.train();
  src(input(3));  // moves the BN running statistics away from their init
  CHECK_FALSE(bitwise_equal(src.features->at<Linear>(0)->weight,
                            dst.features->at<Linear>(0)->weight));

  const StateDict saved = src.state_dict();
  LoadResult r = dst.load_state_dict(saved);
  CHECK(r.missing_keys.empty());
  CHECK(r.unexpected_keys.empty());
  for (const auto& [name, t] : saved) CHECK(bitwise_equal(dst.state_dict().at(name), t));
  CHECK(dst.features->at<BatchNorm1d>(1)->num_batches_tracked.item() == 1);

  // The load copied the values: the models do not share storage.
  auto dst_w = dst.head->weight;
  CHECK_FALSE(dst_w.storage() == src.head->weight.storage());
  CHECK(dst_w.requires_grad());

  src.eval();
  dst.eval();
  CHECK(bitwise_equal(src(input(4)), dst(input(4))));

  // state_dict() tensors alias the model and are detached from autograd.
  CHECK(saved.at("head.weight").storage() == src.head->weight.storage());
  CHECK_FALSE(saved.at("head.weight").requires_grad());
}

TEST_CASE("load_state_dict names every missing, unexpected and mismatched key", "[nn][module]") {
  auto model = std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
      std::make_shared<Linear>(4, 3), std::make_shared<ReLU>(), std::make_shared<Linear>(3, 2)});
  const auto before = values(model->at<Linear>(0)->weight);

  StateDict bad;
  bad.insert("0.weight", Tensor::zeros({3, 4}));      // fine
  bad.insert("2.weight", Tensor::zeros({2, 5}));      // wrong shape
  bad.insert("2.bias", Tensor::zeros({2}));           // fine
  bad.insert("3.weight", Tensor::zeros({1}));         // unexpected
  bad.insert("extra", Tensor::zeros({1}));            // unexpected
  // "0.bias" is missing.

  const std::string msg = error_of([&] { model->load_state_dict(bad); });
  CHECK_THAT(msg, Contains("loading state_dict for Sequential"));
  CHECK_THAT(msg, Contains("missing key(s) in state_dict: \"0.bias\""));
  CHECK_THAT(msg, Contains("unexpected key(s) in state_dict: \"3.weight\", \"extra\""));
  CHECK_THAT(msg, Contains("size mismatch for 2.weight: copying a tensor with shape [2, 5] from "
                           "the state_dict, the shape in the current model is [2, 3]"));
  // Checked before copying: nothing changed.
  CHECK(values(model->at<Linear>(0)->weight) == before);

  // Not strict: missing and unexpected keys are reported, not errors...
  bad.erase("2.weight");
  LoadResult r = model->load_state_dict(bad, /*strict=*/false);
  CHECK(r.missing_keys == std::vector<std::string>{"0.bias", "2.weight"});
  CHECK(r.unexpected_keys == std::vector<std::string>{"3.weight", "extra"});
  CHECK(values(model->at<Linear>(0)->weight) == std::vector<double>(12, 0.0));
  // ...but a shape mismatch still is, as in PyTorch.
  bad.insert("2.weight", Tensor::zeros({3, 3}));
  CHECK_THAT(error_of([&] { model->load_state_dict(bad, false); }),
             Contains("size mismatch for 2.weight"));
}

TEST_CASE("load_state_dict says how to keep a classifier head of another size when fine-tuning",
          "[nn][module]") {
  auto make = [](int64_t classes) {
    return std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
        std::make_shared<Linear>(4, 3), std::make_shared<ReLU>(), std::make_shared<Linear>(3, classes)});
  };
  auto pretrained = make(10), model = make(2);
  StateDict dict = pretrained->state_dict();
  const std::string msg = error_of([&] { model->load_state_dict(dict, /*strict=*/false); });
  CHECK_THAT(msg, Contains("size mismatch for 2.weight"));
  CHECK_THAT(msg, Contains("keep this model's own \"2.weight\", \"2.bias\" (a classifier head of "
                           "another size, replaced for fine-tuning), erase them from the "
                           "state_dict (dict.erase(key)) and load with strict=false"));
  // Doing so loads the backbone and keeps the new head.
  const auto head = values(model->at<Linear>(2)->weight);
  dict.erase("2.weight");
  dict.erase("2.bias");
  const LoadResult r = model->load_state_dict(dict, /*strict=*/false);
  CHECK(r.missing_keys == std::vector<std::string>{"2.weight", "2.bias"});
  CHECK(values(model->at<Linear>(0)->weight) == values(pretrained->at<Linear>(0)->weight));
  CHECK(values(model->at<Linear>(2)->weight) == head);
}

TEST_CASE("load_state_dict names a wrapper's \"module.\" prefix; without_prefix strips it",
          "[nn][module]") {
  auto make = [] {
    return std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
        std::make_shared<Linear>(4, 3), std::make_shared<ReLU>(), std::make_shared<Linear>(3, 2)});
  };
  auto saved = make(), model = make();
  // As a DistributedDataParallel or DataParallel wrapper saves it.
  StateDict wrapped;
  for (const auto& [name, t] : saved->state_dict()) wrapped.insert("module." + name, t);
  CHECK_THAT(error_of([&] { model->load_state_dict(wrapped); }),
             Contains("saved from a DistributedDataParallel or DataParallel wrapper") &&
                 Contains("without_prefix(\"module.\")"));
  model->load_state_dict(wrapped.without_prefix("module."));
  CHECK(values(model->at<Linear>(2)->weight) == values(saved->at<Linear>(2)->weight));

  // The other way round: a bare model's state_dict into the wrapper.
  DataParallel wrapper(make(), std::vector<Device>(2, Device::cpu()));
  CHECK_THAT(error_of([&] { wrapper.load_state_dict(saved->state_dict()); }),
             Contains("saved from the bare model: load it into the wrapper's module()"));
  // Unrelated keys get no hint; names that would collide are refused.
  StateDict other;
  other.insert("module.extra", Tensor::zeros({1}));
  CHECK_THAT(error_of([&] { model->load_state_dict(other); }), !Contains("wrapper"));
  other.insert("extra", Tensor::zeros({1}));
  CHECK_THAT(error_of([&] { other.without_prefix("module."); }),
             Contains("would become \"extra\", a key already there"));
}

TEST_CASE("load_state_dict names a prefix the state_dict's keys have, or lack, and only then",
          "[nn][module]") {
  auto make = [] {
    return std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
        std::make_shared<Linear>(4, 3), std::make_shared<ReLU>(), std::make_shared<Linear>(3, 2)});
  };
  auto saved = make(), model = make();
  // A training checkpoint: the model under "model.", beside the optimizer's state.
  StateDict checkpoint;
  for (const auto& [name, t] : saved->state_dict()) checkpoint.insert("model." + name, t);
  for (int i = 0; i < 4; ++i)
    for (const char* key : {"exp_avg", "exp_avg_sq", "step"})
      checkpoint.insert(fmt::format("optimizer.state.{}.{}", i, key), Tensor::zeros({1}));
  CHECK_THAT(error_of([&] { model->load_state_dict(checkpoint); }),
             Contains("the state_dict's keys are this model's with \"model.\" in front, as a "
                      "training checkpoint keeps the model") &&
                 Contains("dict.under(\"model.\")"));
  model->load_state_dict(checkpoint.under("model."));
  CHECK(values(model->at<Linear>(2)->weight) == values(saved->at<Linear>(2)->weight));

  // One Linear's keys fit "0." as well as "2.": a guess is no hint.
  CHECK_THAT(error_of([&] { model->load_state_dict(Linear(4, 3).state_dict()); }),
             !Contains("in front"));
  // One of many keys explained by a prefix is no hint either.
  StateDict mostly_other;
  for (int i = 0; i < 6; ++i) mostly_other.insert(fmt::format("x{}", i), Tensor::zeros({1}));
  mostly_other.insert("extra.2.bias", Tensor::zeros({2}));
  CHECK_THAT(error_of([&] { model->load_state_dict(mostly_other); }), !Contains("in front"));
}

TEST_CASE("load_state_dict copies nothing when a source overlaps what it writes, and reads "
          "every source as the dict held it",
          "[nn][module]") {
  Generator g(1);
  auto s = std::make_shared<Sequential>();
  auto l0 = s->push_back(std::make_shared<Linear>(3, 3, false, g));
  auto l1 = s->push_back(std::make_shared<Linear>(3, 3, false, g));
  const auto w0 = values(l0->weight), w1 = values(l1->weight);
  const auto transposed = [](const std::vector<double>& v) {
    std::vector<double> t(9);
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) t[3 * j + i] = v[3 * i + j];
    return t;
  };

  // 1.weight from its own transpose: loaded as it was before the load began
  // (it used to throw after 0.weight had been zeroed).
  StateDict d;
  d.insert("0.weight", Tensor::zeros({3, 3}));
  d.insert("1.weight", l1->weight.detach().t());
  s->load_state_dict(d);
  CHECK(values(l0->weight) == std::vector<double>(9, 0.0));
  CHECK(values(l1->weight) == transposed(w1));

  // Swapped weights: the second read is not the first write's result.
  {
    lockstep::runtime::NoGradGuard no_grad;
    l0->weight.copy_(Tensor::from_vector<double>(w0, {3, 3}));
    l1->weight.copy_(Tensor::from_vector<double>(w1, {3, 3}));
  }
  StateDict swap;
  swap.insert("0.weight", l1->weight.detach());
  swap.insert("1.weight", l0->weight.detach());
  s->load_state_dict(swap);
  CHECK(values(l0->weight) == w1);
  CHECK(values(l1->weight) == w0);

  // A model's own state_dict loads back as a no-op, tied weights included.
  auto gpt = lockstep::models::gpt(
      {.vocab_size = 11, .block_size = 4, .n_layer = 1, .n_head = 2, .n_embd = 4}, 0);
  const StateDict own = gpt->state_dict();
  std::vector<std::vector<double>> before;
  for (const auto& [k, v] : own) before.push_back(values(v));
  gpt->load_state_dict(own);
  size_t i = 0;
  for (const auto& [k, v] : gpt->state_dict()) CHECK(values(v) == before[i++]);
}

TEST_CASE("load_state_dict converts dtype", "[nn][module]") {
  Linear a(2, 2), b(2, 2);
  StateDict sd;
  sd.insert("weight", Tensor::from_vector<double>({1, 2, 3, 4}, {2, 2}));
  sd.insert("bias", Tensor::from_vector<double>({5, 6}, {2}));
  a.load_state_dict(sd);
  CHECK(a.weight.dtype() == DType::f32);
  CHECK(values(a.weight) == std::vector<double>{1, 2, 3, 4});
  CHECK(values(a.bias) == std::vector<double>{5, 6});
}

TEST_CASE("train() and eval() reach every submodule and change BN and Dropout", "[nn][module]") {
  Sequential model{std::make_shared<BatchNorm1d>(3), std::make_shared<Dropout>(0.5, 7)};
  auto bn = model.at<BatchNorm1d>(0);
  auto drop = model.at<Dropout>(1);
  CHECK(model.is_training());
  CHECK(bn->is_training());

  Generator g(11);
  Tensor x = lockstep::runtime::randn({64, 3}, DType::f32, g) * 3.0 + 2.0;

  // Training: batch statistics (output mean ~0 before dropout), running
  // statistics updated, dropout zeroes about half.
  Tensor y = model(x);
  CHECK(bn->num_batches_tracked.item() == 1);
  CHECK(values(bn->running_mean) != std::vector<double>(3, 0.0));
  int zeros = 0;
  for (double v : values(y)) zeros += v == 0.0;
  CHECK(zeros > 64 * 3 / 4);
  CHECK(zeros < 64 * 3 * 3 / 4);

  model.eval();
  CHECK_FALSE(bn->is_training());
  CHECK_FALSE(drop->is_training());
  const auto running_mean = values(bn->running_mean);
  Tensor z = model(x);
  // Eval: running statistics, unchanged; dropout is the identity.
  CHECK(bn->num_batches_tracked.item() == 1);
  CHECK(values(bn->running_mean) == running_mean);
  Tensor expect = lockstep::runtime::batch_norm(x, bn->weight, bn->bias, bn->running_mean,
                                                bn->running_var, false, 0.1, 1e-5);
  CHECK(bitwise_equal(z, expect));

  model.train();
  CHECK(drop->is_training());
  CHECK(bn->is_training());
}

TEST_CASE("to() keeps tensor identity and converts floating tensors only", "[nn][module]") {
  Net net;
  auto w = net.head->weight;
  net.to(Device::cpu());
  CHECK(net.head->weight.is_same(w));

  net.head->weight.set_grad(Tensor::ones({2, 4}));
  net.to(DType::f64);
  CHECK(w.dtype() == DType::f64);  // the same handle sees the new data
  CHECK(w.requires_grad());
  CHECK(w.grad().dtype() == DType::f64);
  CHECK(net.features->at<BatchNorm1d>(1)->running_var.dtype() == DType::f64);
  CHECK(net.features->at<BatchNorm1d>(1)->num_batches_tracked.dtype() == DType::i64);
  CHECK(net(input(0).to(DType::f64)).dtype() == DType::f64);

  CHECK_THROWS_AS(net.to(Device::cuda(0)), lockstep::Error);
  CHECK_THROWS_AS(net.to(DType::i32), lockstep::Error);
}

TEST_CASE("zero_grad drops gradients", "[nn][module]") {
  Net net;
  lockstep::runtime::sum(net(input(0))).backward();
  for (const auto& p : net.parameters()) CHECK(p.grad().defined());
  net.zero_grad();
  for (const auto& p : net.parameters()) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("str() prints the module tree as PyTorch does", "[nn][module]") {
  Net net;
  CHECK(net.str() ==
        "Net(\n"
        "  (features): Sequential(\n"
        "    (0): Linear(in_features=3, out_features=4, bias=true)\n"
        "    (1): BatchNorm1d(4, eps=1e-05, momentum=0.1, affine=true, track_running_stats=true)\n"
        "    (2): ReLU()\n"
        "  )\n"
        "  (head): Linear(in_features=4, out_features=2, bias=true)\n"
        ")");
}

TEST_CASE("StateDict keeps insertion order and rejects duplicates", "[nn][module]") {
  StateDict sd;
  sd.insert("b", Tensor::zeros({1}));
  sd.insert("a", Tensor::ones({1}));
  CHECK(sd.keys() == std::vector<std::string>{"b", "a"});
  CHECK(sd.at("a").item() == 1.0);
  CHECK(sd.find("c") == nullptr);
  CHECK_THAT(error_of([&] { sd.insert("a", Tensor::zeros({1})); }),
             Contains("already present"));
  CHECK_THAT(error_of([&] { sd.at("c"); }), Contains("no key \"c\""));
  StateDict copy(std::vector<StateDict::Item>(sd.begin(), sd.end()));
  CHECK(copy.keys() == sd.keys());
  CHECK(copy.items().size() == 2);
  CHECK(sd.erase("b"));
  CHECK(sd.keys() == std::vector<std::string>{"a"});
  CHECK(sd.at("a").item() == 1.0);
}
