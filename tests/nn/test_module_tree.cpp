// The module tree's shape: typed pointers to children that follow
// replace_child (bind_child), each module visited once by apply() and
// named_children(), trees that would contain themselves refused, and the
// structure stamps that say when the tree changed; with the built-in models
// (ResNet, GPT, Checkpoint, DataParallel) after convert_sync_batchnorm.
#include <catch2/catch.hpp>

#include <map>

#include "lockstep/models/models.h"
#include "lockstep/nn/nn.h"
#include "lockstep/nn/sync_batch_norm.h"
#include "lockstep/runtime/ops.h"
#include "nn/ddp/ddp_fixture.h"
#include "support/test_util.h"

using namespace lockstep::nn;
using namespace lockstep::testing;
namespace models = lockstep::models;
namespace lr = lockstep::runtime;
using Catch::Contains;

namespace {

// Calls its child "inner" through a bound field typed as a BatchNormBase.
struct Holder : Module {
  Holder() { register_module("inner", std::make_shared<BatchNorm1d>(3), inner); }
  Tensor forward(const Tensor& x) override { return (*inner)(x); }
  std::string type_name() const override { return "Holder"; }
  std::shared_ptr<BatchNormBase> inner;
};

int count_type(Module& m, const std::string& type) {
  int n = 0;
  for (const auto& [name, sub] : m.named_modules()) n += sub->type_name() == type ? 1 : 0;
  return n;
}

// Every module of `m` whose type is `type`, with its num_batches_tracked.
std::map<std::string, double> batches_tracked(Module& m, const std::string& type) {
  std::map<std::string, double> out;
  for (const auto& [name, sub] : m.named_modules())
    if (sub->type_name() == type)
      out[name] = dynamic_cast<BatchNormBase&>(*sub).num_batches_tracked.item();
  return out;
}

}  // namespace

TEST_CASE("bind_child: a bound field follows replace_child and refuses another kind",
          "[nn][module]") {
  Holder h;
  auto old = h.inner;
  auto sync = std::make_shared<SyncBatchNorm>(3, nullptr);
  h.replace_child("inner", sync);
  CHECK(h.inner == sync);
  CHECK(h.child<SyncBatchNorm>("inner") == sync);

  // Not a BatchNormBase: refused, naming both, and nothing changed.
  const std::string msg = error_of([&] { h.replace_child("inner", std::make_shared<ReLU>()); });
  CHECK_THAT(msg, Contains("Holder: replace_child(\"inner\")"));
  CHECK_THAT(msg, Contains("Holder calls this submodule as a nn::BatchNormBase"));
  CHECK_THAT(msg, Contains("a ReLU, is not one"));
  CHECK(h.inner == sync);
  CHECK(h.child_list()[0].second == sync);
  // The forward runs the module in the tree.
  h.forward(lr::randn({4, 3}));
  CHECK(sync->num_batches_tracked.item() == 1);
  CHECK(old->num_batches_tracked.item() == 0);

  CHECK_THAT(error_of([&] { h.child<Linear>("inner"); }),
             Contains("child(\"inner\") is a SyncBatchNorm, not a nn::Linear"));
  CHECK_THAT(error_of([&] { h.child("nothing"); }), Contains("no submodule of that name"));
}

TEST_CASE("apply and named_children visit a module registered twice once", "[nn][module]") {
  auto a = std::make_shared<Linear>(2, 2);
  Sequential s{a, a};
  int calls_on_a = 0, calls = 0;
  s.apply([&](Module& m) {
    ++calls;
    calls_on_a += &m == a.get() ? 1 : 0;
  });
  CHECK(calls_on_a == 1);
  CHECK(calls == 2);
  REQUIRE(s.named_children().size() == 1);
  CHECK(s.named_children()[0].first == "0");
  CHECK(s.children().size() == 1);
  CHECK(s.child_list().size() == 2);  // every entry
  CHECK(s.named_modules().size() == 2);

  // Shared by two parents: once as well, children before parents.
  auto shared = std::make_shared<ReLU>();
  Sequential outer{std::make_shared<Sequential>(), shared};
  outer.at<Sequential>(0)->push_back(shared);
  std::vector<std::string> order;
  outer.apply([&](Module& m) { order.push_back(m.type_name()); });
  CHECK(order == std::vector<std::string>{"ReLU", "Sequential", "Sequential"});
}

TEST_CASE("a tree that would contain itself is refused", "[nn][module]") {
  auto a = std::make_shared<Sequential>();
  auto b = std::make_shared<Sequential>();
  auto c = std::make_shared<Sequential>();
  a->push_back(b);
  b->push_back(c);
  CHECK_THAT(error_of([&] { c->push_back(a); }), Contains("this module is inside the new Sequential"));
  CHECK_THAT(error_of([&] { b->push_back(b); }), Contains("would contain itself"));
  CHECK_THAT(error_of([&] { c->register_module("x", a); }), Contains("cannot be a submodule of itself"));
  c->push_back(std::make_shared<ReLU>());
  CHECK_THAT(error_of([&] { c->replace_child("0", a); }), Contains("would contain itself"));
  CHECK_THAT(error_of([&] { c->replace_child("0", c); }), Contains("the new module is this module"));
  CHECK(c->size() == 1);
  CHECK(c->at<ReLU>(0) != nullptr);
  // Nothing recurses forever: the tree is as it was.
  CHECK(a->named_modules().size() == 4);
  a->train(false);
  CHECK(a->state_dict().size() == 0);
  // A module shared across branches is no cycle.
  auto d = std::make_shared<Sequential>();
  d->push_back(c);
  a->push_back(d);
  CHECK(a->named_modules().size() == 5);
}

TEST_CASE("structure_stamps change with every added or replaced child or added parameter",
          "[nn][module]") {
  auto inner = std::make_shared<Sequential>();
  inner->push_back(std::make_shared<ReLU>());
  Sequential outer{inner, std::make_shared<Linear>(2, 2)};
  const auto s0 = outer.structure_stamps();
  CHECK(s0.size() == 4);
  CHECK(outer.structure_stamps() == s0);
  outer.train(false);
  outer.forward(lr::randn({1, 2}));
  CHECK(outer.structure_stamps() == s0);  // running and mode changes are not structure

  inner->replace_child("0", std::make_shared<ReLU>());
  const auto s1 = outer.structure_stamps();
  CHECK(s1 != s0);
  inner->push_back(std::make_shared<GELU>());
  const auto s2 = outer.structure_stamps();
  CHECK(s2 != s1);
  CHECK(s2.size() == 5);
  // The same module put back is a change too (the stamp is per change).
  const auto same = inner->child("0");
  inner->replace_child("0", same);
  const auto s3 = outer.structure_stamps();
  CHECK(s3 != s2);
  // A parameter registered later is a change too: a wrapper made before
  // holds no bucket or replica of it.
  inner->register_parameter("extra", lr::randn({2}));
  CHECK(outer.structure_stamps() != s3);
}

TEST_CASE("convert_sync_batchnorm on a ResNet: its forward runs the SyncBatchNorms and every "
          "parameter gets a gradient",
          "[nn][syncbn][resnet][models]") {
  auto resnet = models::resnet18_cifar(0);
  const std::vector<std::shared_ptr<BatchNormBase>> old_bns{resnet->bn1,
                                                            resnet->layers[1]->at<models::BasicBlock>(0)->bn2};
  auto converted = convert_sync_batchnorm(resnet, nullptr);
  REQUIRE(converted == resnet);
  CHECK(count_type(*converted, "SyncBatchNorm") == 20);
  CHECK(count_type(*converted, "BatchNorm2d") == 0);
  // The typed fields are the modules of the tree.
  CHECK(resnet->bn1->type_name() == "SyncBatchNorm");
  CHECK(resnet->bn1 == resnet->child("bn1"));
  for (const auto& layer : resnet->layers) {
    for (size_t b = 0; b < layer->size(); ++b) {
      auto block = layer->at<models::BasicBlock>(b);
      CHECK(block->bn1 == block->child("bn1"));
      CHECK(block->bn2 == block->child("bn2"));
      CHECK(block->bn2->type_name() == "SyncBatchNorm");
    }
  }

  lr::Generator g(1);
  lr::sum(converted->forward(lr::randn({2, 3, 32, 32}, DType::f32, g))).backward();
  const auto params = converted->named_parameters();
  CHECK(params.size() == 62);
  for (const auto& [name, p] : params) {
    INFO(name);
    CHECK(p.grad().defined());
  }
  // Every SyncBatchNorm ran once; the old BatchNorms not at all.
  for (const auto& [name, n] : batches_tracked(*converted, "SyncBatchNorm")) {
    INFO(name);
    CHECK(n == 1);
  }
  for (const auto& bn : old_bns) CHECK(bn->num_batches_tracked.item() == 0);
  // The state_dict holds the statistics of the modules that ran.
  CHECK(converted->state_dict().at("bn1.num_batches_tracked").item() == 1);
}

TEST_CASE("convert_sync_batchnorm reaches Checkpoint's and DataParallel's module, and a shared "
          "BatchNorm stays shared",
          "[nn][syncbn][checkpoint][data_parallel]") {
  auto bn = std::make_shared<BatchNorm1d>(3);
  auto ckpt = std::make_shared<Checkpoint>(bn);
  convert_sync_batchnorm(ckpt, nullptr);
  REQUIRE(ckpt->module->type_name() == "SyncBatchNorm");
  CHECK(ckpt->module == ckpt->child("module"));
  lr::sum(lr::mul(ckpt->forward(lr::randn({4, 3})), lr::randn({4, 3}))).backward();
  for (const auto& p : ckpt->parameters()) CHECK(p.grad().defined());
  CHECK(bn->num_batches_tracked.item() == 0);
  CHECK(std::dynamic_pointer_cast<SyncBatchNorm>(ckpt->module)->num_batches_tracked.item() >= 1);

  // DataParallel: one device and two (the replica made from the SyncBatchNorm).
  for (int devices : {1, 2}) {
    auto plain = std::make_shared<BatchNorm1d>(3);
    auto dp = std::make_shared<DataParallel>(
        plain, std::vector<lr::Device>(static_cast<size_t>(devices), lr::Device::cpu()));
    dp->forward(lr::randn({4, 3}));  // replicas made (with 2 devices) before the conversion
    convert_sync_batchnorm(dp, nullptr);
    REQUIRE(dp->module().type_name() == "SyncBatchNorm");
    lr::sum(dp->forward(lr::randn({4, 3}))).backward();
    for (const auto& p : dp->parameters()) CHECK(p.grad().defined());
    // The first forward's update was copied over; the second reached the new module only.
    CHECK(plain->num_batches_tracked.item() == 1);
    CHECK(dynamic_cast<SyncBatchNorm&>(dp->module()).num_batches_tracked.item() == 2);
  }

  // One BatchNorm under two names becomes one SyncBatchNorm under both.
  auto shared = std::make_shared<BatchNorm1d>(3);
  auto seq = std::make_shared<Sequential>();
  seq->push_back(shared);
  seq->push_back(shared);
  convert_sync_batchnorm(seq, nullptr);
  CHECK(seq->at<SyncBatchNorm>(0) == seq->at<SyncBatchNorm>(1));
}

TEST_CASE("replace_child refuses a module of the wrong kind where a model calls a typed child",
          "[nn][models][module]") {
  auto resnet = models::resnet18_cifar(0);
  auto block = resnet->layers[0]->at<models::BasicBlock>(0);
  const auto bn1 = block->bn1;
  CHECK_THAT(error_of([&] { block->replace_child("bn1", std::make_shared<ReLU>()); }),
             Contains("BasicBlock calls this submodule as a nn::BatchNormBase"));
  CHECK(block->bn1 == bn1);
  CHECK(block->child("bn1") == bn1);
  CHECK_THAT(error_of([&] { resnet->replace_child("fc", std::make_shared<ReLU>()); }),
             Contains("ResNet calls this submodule as a nn::Linear"));
  CHECK_THAT(error_of([&] { resnet->replace_child("layer2", std::make_shared<ReLU>()); }),
             Contains("ResNet calls this submodule as a nn::Sequential"));
  // One of the right kind is used by the forward.
  auto fc = std::make_shared<Linear>(512, 3);
  resnet->replace_child("fc", fc);
  CHECK(resnet->fc == fc);
  auto layer = std::make_shared<Sequential>();
  layer->push_back(std::make_shared<ReLU>());
  resnet->replace_child("layer4", layer);  // 256 channels stay 256
  CHECK(resnet->layers[3] == layer);
  auto fc256 = std::make_shared<Linear>(256, 3);
  resnet->replace_child("fc", fc256);
  CHECK(resnet->forward(lr::randn({1, 3, 32, 32})).shape() == lr::Shape{1, 3});

  // GPT: a typed child of its own, and transformer's children through it.
  auto gpt = models::gpt({.vocab_size = 11, .block_size = 4, .n_layer = 1, .n_head = 2, .n_embd = 4}, 0);
  CHECK_THAT(error_of([&] { gpt->transformer->replace_child("ln_f", std::make_shared<ReLU>()); }),
             Contains("GPT calls this submodule as a nn::LayerNorm"));
  CHECK_THAT(error_of([&] { gpt->replace_child("lm_head", std::make_shared<ReLU>()); }),
             Contains("GPT calls this submodule as a nn::Linear"));
  auto gblock = gpt->h()->at<models::GptBlock>(0);
  CHECK_THAT(error_of([&] { gblock->replace_child("attn", std::make_shared<ReLU>()); }),
             Contains("Block calls this submodule as a nn::MultiheadSelfAttention"));
  CHECK_THAT(error_of([&] { gblock->attn->replace_child("c_proj", std::make_shared<ReLU>()); }),
             Contains("MultiheadSelfAttention calls this submodule as a nn::Linear"));
  // A replaced LayerNorm is the one the forward runs (its gradient arrives).
  auto ln_f = std::make_shared<LayerNorm>(std::vector<int64_t>{4});
  gpt->transformer->replace_child("ln_f", ln_f);
  CHECK(gpt->ln_f() == ln_f);
  auto c_fc = std::make_shared<Linear>(4, 16);
  gblock->mlp->replace_child("c_fc", c_fc);
  CHECK(gblock->mlp->c_fc == c_fc);
  const Tensor idx = Tensor::from_vector<int64_t>({1, 2, 3, 4}, {1, 4});
  lr::sum(gpt->forward(idx)).backward();
  CHECK(ln_f->weight.grad().defined());
  CHECK(c_fc->weight.grad().defined());
}

TEST_CASE("DDP refuses to have its wrapped module replaced after its buckets are built",
          "[nn][syncbn][ddp]") {
  const auto problems = on_ranks(1, [](int, auto group) -> std::string {
    auto bn = std::make_shared<BatchNorm1d>(3);
    auto ddp = std::make_shared<DistributedDataParallel>(bn, group);
    const std::string msg = error_of([&] { convert_sync_batchnorm(ddp, group); });
    if (msg.find("DistributedDataParallel: replace_child(\"module\")") == std::string::npos ||
        msg.find("before wrapping it") == std::string::npos)
      return "unexpected error: " + msg;
    if (&ddp->module() != bn.get()) return "the module changed";
    return "";
  });
  for (const auto& p : problems) CHECK(p == "");
}
