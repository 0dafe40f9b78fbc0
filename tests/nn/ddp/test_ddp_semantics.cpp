// DDP's construction check, replica synchronisation, unused parameters, the
// errors PyTorch users hit, bucket rebuilding and statistics; in-process over gloo.
#include <catch2/catch.hpp>

#include "lockstep/nn/normalization.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/autograd/node.h"
#include "nn/ddp/ddp_fixture.h"
#include "support/test_util.h"

namespace lt = lockstep::testing;
namespace nn = lockstep::nn;
using lockstep::nn::DdpOptions;
using lockstep::nn::DistributedDataParallel;
using lockstep::runtime::Tensor;

namespace {

// Two heads over one input; forward uses head b only when asked to.
class TwoHeads : public nn::Module {
 public:
  TwoHeads(uint64_t seed, bool register_b_first = false) {
    lockstep::runtime::Generator g(seed);
    auto a_layer = std::make_shared<nn::Linear>(12, 5, true, g);
    auto b_layer = std::make_shared<nn::Linear>(5, 5, true, g);
    if (register_b_first) {
      b = register_module("b", b_layer);
      a = register_module("a", a_layer);
    } else {
      a = register_module("a", a_layer);
      b = register_module("b", b_layer);
    }
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = a->forward(x);
    return use_b ? b->forward(h) : h;
  }
  std::shared_ptr<nn::Linear> a, b;
  bool use_b = true;
};

// forward_values returns both heads' outputs over one input.
class TwoOutputs : public nn::Module {
 public:
  explicit TwoOutputs(uint64_t seed) {
    lockstep::runtime::Generator g(seed);
    a = register_module("a", std::make_shared<nn::Linear>(12, 5, true, g));
    b = register_module("b", std::make_shared<nn::Linear>(12, 5, true, g));
  }
  Tensor forward(const Tensor& x) override { return a->forward(x); }
  nn::Values forward_values(const nn::Values& in) override {
    return {a->forward(in.tensor(0)), b->forward(in.tensor(0))};
  }
  std::shared_ptr<nn::Linear> a, b;
};

}  // namespace

TEST_CASE("DDP: ranks built with different models fail at construction, naming the parameter",
          "[ddp]") {
  const auto problems = lt::on_ranks(3, [](int r, auto group) -> std::string {
    // Rank 2's middle layer is wider.
    auto model = lt::small_mlp(1, 12, r == 2 ? 17 : 16);
    DistributedDataParallel ddp(model, group);
    return "constructed";
  });
  for (const auto& p : problems) {
    INFO(p);
    REQUIRE_THAT(p, Catch::Contains("ranks hold different models") &&
                        Catch::Contains("Parameter #0: rank 0 holds '0.weight' [16, 12] f32") &&
                        Catch::Contains("rank 2 holds '0.weight' [17, 12] f32"));
  }
}

TEST_CASE("DDP: ranks whose buffers differ fail at construction, naming the buffer", "[ddp]") {
  // The same parameters everywhere, and buffers of the same total size, so
  // that the packed broadcast of rank 0's buffers would go through: rank 1
  // registers them with each other's shapes, as a buffer sized by the rank's
  // own data would be.
  const auto problems = lt::on_ranks(2, [](int r, auto group) -> std::string {
    auto model = lt::small_mlp(1);
    model->register_buffer("class_counts", Tensor::zeros({r == 0 ? 4 : 3}));
    model->register_buffer("seen", Tensor::zeros({r == 0 ? 3 : 4}));
    DistributedDataParallel ddp(model, group);
    return "constructed";
  });
  for (const auto& p : problems) {
    INFO(p);
    REQUIRE_THAT(p, Catch::Contains("ranks hold different buffers") &&
                        Catch::Contains("Buffer #0: rank 0 holds 'class_counts' [4] f32") &&
                        Catch::Contains("rank 1 holds 'class_counts' [3] f32"));
  }
}

TEST_CASE("DDP: construction copies rank 0's parameters and buffers; broadcast_parameters "
          "repairs a hand change",
          "[ddp]") {
  const auto problems = lt::on_ranks(2, [](int r, auto group) -> std::string {
    auto model = lt::small_mlp(r == 0 ? 1 : 2);
    DistributedDataParallel ddp(model, group);
    const auto reference = lt::small_mlp(1)->parameters();
    for (size_t i = 0; i < reference.size(); ++i) {
      if (!lt::bitwise_equal(model->parameters()[i], reference[i])) return "not rank 0's parameters";
    }
    if (r == 1) {
      lockstep::runtime::NoGradGuard no_grad;
      model->parameters()[0].fill_(42.0);  // changed by hand on one rank only
    }
    ddp.broadcast_parameters();
    if (!lt::bitwise_equal(model->parameters()[0], reference[0])) return "hand change survived";
    return "";
  });
  REQUIRE(lt::joined(problems).empty());
}

TEST_CASE("DDP: without broadcast_buffers each rank keeps its own buffers from the start",
          "[ddp]") {
  // As PyTorch: statistics of each rank's own data, here of another size on
  // rank 1, are neither refused nor overwritten by rank 0's.
  const auto problems = lt::on_ranks(2, [](int r, auto group) -> std::string {
    auto model = lt::small_mlp(1);
    Tensor mine = model->register_buffer("mine", Tensor::full({2}, r + 1.0));
    Tensor sized = model->register_buffer("sized", Tensor::zeros({r == 0 ? 4 : 3}));
    DistributedDataParallel ddp(model, group, DdpOptions{.broadcast_buffers = false});
    if (mine.to_vector<float>() != std::vector<float>(2, r + 1.0f)) return "overwritten";
    if (sized.numel() != (r == 0 ? 4 : 3)) return "resized";
    return "";
  });
  REQUIRE(lt::joined(problems).empty());
}

TEST_CASE("DDP: bool and u8 buffers (a mask, flags) are wrapped and take rank 0's values",
          "[ddp]") {
  using lockstep::runtime::DType;
  const auto global = lt::global_batch(8, 3);
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    auto model = lt::small_mlp(1);
    Tensor mask =
        model->register_buffer("mask", Tensor::full({5}, r == 0 ? 1 : 0, DType::boolean));
    Tensor flags = model->register_buffer("flags", Tensor::full({3}, r == 0 ? 7 : 0, DType::u8));
    DistributedDataParallel ddp(model, group);
    const auto values = [](const Tensor& t) { return t.to(DType::f64).to_vector<double>(); };
    if (values(mask) != std::vector<double>(5, 1.0)) return "mask is not rank 0's";
    if (values(flags) != std::vector<double>(3, 7.0)) return "flags are not rank 0's";
    // broadcast_buffers: rank 0's values again before a training forward.
    {
      lockstep::runtime::NoGradGuard no_grad;
      flags.fill_(r == 0 ? 200 : 1);
    }
    lt::loss_of(ddp, lt::shard(global, r, 2)).backward();
    if (values(flags) != std::vector<double>(3, 200.0)) return "flags after forward not rank 0's";
    return "";
  });
  REQUIRE(lt::joined(problems).empty());
}

TEST_CASE("DDP: BatchNorm without sync uses local batch statistics; rank 0's running "
          "statistics are broadcast before each forward",
          "[ddp]") {
  const auto global = lt::global_batch(16, 5);
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    auto make = [] {
      auto m = std::make_shared<nn::Sequential>();
      m->push_back(std::make_shared<nn::BatchNorm1d>(12));
      return m;
    };
    auto model = make();
    DistributedDataParallel ddp(model, group);
    auto* bn = dynamic_cast<nn::BatchNorm1d*>(model->children()[0].get());
    const auto local = lt::shard(global, r, 2);
    Tensor out = ddp.forward(local.x);
    // The same layer alone on this rank's batch: the same output and the same
    // running statistics (all ranks start from rank 0's zeros/ones).
    auto alone = make();
    Tensor expected = alone->forward(local.x);
    auto* alone_bn = dynamic_cast<nn::BatchNorm1d*>(alone->children()[0].get());
    if (auto p = lt::mismatch("output", out, expected, 1e-6); !p.empty()) return p;
    if (auto p = lt::mismatch("running_mean", bn->running_mean, alone_bn->running_mean, 1e-6); !p.empty()) return p;
    // Ranks now hold different running means; the next forward first copies
    // rank 0's. Rank 0's value after its first forward:
    auto rank0 = make();
    rank0->forward(lt::shard(global, 0, 2).x);
    auto* rank0_bn = dynamic_cast<nn::BatchNorm1d*>(rank0->children()[0].get());
    // Second forward in eval mode: no broadcast (eval reads buffers only)...
    ddp.eval();
    ddp.forward(local.x);
    const bool same_as_rank0 = lt::bitwise_equal(bn->running_mean, rank0_bn->running_mean);
    if (r == 1 && same_as_rank0) return "eval forward broadcast the buffers";
    // ...then in training: broadcast first, then this rank's update on top.
    ddp.train();
    ddp.forward(local.x);
    auto replay = make();
    auto* replay_bn = dynamic_cast<nn::BatchNorm1d*>(replay->children()[0].get());
    {
      lockstep::runtime::NoGradGuard no_grad;
      replay_bn->running_mean.copy_(rank0_bn->running_mean);
      replay_bn->running_var.copy_(rank0_bn->running_var);
    }
    replay->forward(local.x);
    return lt::mismatch("running_mean after broadcast", bn->running_mean, replay_bn->running_mean, 1e-6);
  });
  REQUIRE(lt::joined(problems).empty());
}

TEST_CASE("DDP: a model converted to another dtype after wrapping is refused at the next "
          "forward",
          "[ddp]") {
  // Its f32 buckets would average the f64 gradients in f32.
  const auto batch = lt::global_batch(8, 4);
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    DistributedDataParallel ddp(lt::small_mlp(1), group);
    ddp.to(lockstep::runtime::DType::f64);
    auto local = lt::shard(batch, r, 2);
    local.x = local.x.to(lockstep::runtime::DType::f64);
    lt::loss_of(ddp, local).backward();
    return "no error";
  });
  for (const auto& p : problems) {
    REQUIRE_THAT(p, Catch::Contains("parameter '0.weight' is f64 on cpu now, but was f32 on cpu "
                                    "when the module was wrapped") &&
                        Catch::Contains("wrap the converted module in a new"));
  }
}

TEST_CASE("DDP: a submodule replaced inside the wrapped model after wrapping is refused",
          "[ddp]") {
  // Its parameters were in no bucket: they trained on each rank's own gradient.
  const auto batch = lt::global_batch(8, 4);
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    auto model = std::make_shared<TwoHeads>(1);
    DistributedDataParallel ddp(model, group);
    lockstep::runtime::Generator g(7);
    model->replace_child("b", std::make_shared<nn::Linear>(5, 5, true, g));
    lt::loss_of(ddp, lt::shard(batch, r, 2)).backward();
    return "no error";
  });
  for (const auto& p : problems)
    CHECK_THAT(p, Catch::Contains("replaced after wrapping") &&
                      Catch::Contains("wrap the changed model in a new DistributedDataParallel"));
}

TEST_CASE("DDP: a parameter registered in the wrapped model after wrapping is refused",
          "[ddp]") {
  // No bucket holds it: each rank trained it on its own gradient, and the
  // replicas drifted apart without an error.
  class Scaled : public nn::Module {
   public:
    Tensor forward(const Tensor& x) override { return scale.defined() ? x * scale : x; }
    Tensor scale;
  };
  const auto batch = lt::global_batch(8, 4);
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    auto model = lt::small_mlp(1);
    auto scaled = model->push_back(std::make_shared<Scaled>());
    DistributedDataParallel ddp(model, group);
    scaled->scale = scaled->register_parameter("scale", Tensor::ones({}));
    lt::loss_of(ddp, lt::shard(batch, r, 2)).backward();
    return "no error";
  });
  for (const auto& p : problems)
    CHECK_THAT(p, Catch::Contains("submodule or parameter of the wrapped model was added") &&
                      Catch::Contains("register_parameter") &&
                      Catch::Contains("wrap the changed model in a new DistributedDataParallel"));
}

TEST_CASE("DDP: a parameter with no gradient is named unless find_unused_parameters", "[ddp]") {
  const auto batch = lt::global_batch(8, 4);
  SECTION("without the option: a clear error naming it") {
    const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
      auto model = std::make_shared<TwoHeads>(1);
      model->use_b = false;
      DistributedDataParallel ddp(model, group);
      lt::loss_of(ddp, lt::shard(batch, r, 2)).backward();
      return "no error";
    });
    for (const auto& p : problems) {
      REQUIRE_THAT(p, Catch::Contains("received no gradient") && Catch::Contains("'b.weight'") &&
                          Catch::Contains("'b.bias'") && Catch::Contains("find_unused_parameters"));
    }
  }
  SECTION("with it: unused everywhere keeps .grad untouched; unused on one rank is averaged") {
    const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
      auto model = std::make_shared<TwoHeads>(1);
      DistributedDataParallel ddp(model, group, DdpOptions{.find_unused_parameters = true});
      const auto local = lt::shard(batch, r, 2);
      model->use_b = false;
      lt::loss_of(ddp, local).backward();
      if (model->b->weight.grad().defined()) return "unused on every rank, yet .grad was written";
      // Expected for `a`: the average of the two ranks' local gradients.
      // Next iteration: b used on rank 0 only.
      ddp.zero_grad();
      model->use_b = r == 0;
      lt::loss_of(ddp, local).backward();
      auto alone = std::make_shared<TwoHeads>(1);
      lt::loss_of(*alone, lt::shard(batch, 0, 2)).backward();
      // Rank 0's gradient of b, divided by 2 (rank 1 contributed zeros).
      Tensor expected = lockstep::runtime::mul(alone->b->weight.grad(), 0.5);
      return lt::mismatch("b.weight.grad", model->b->weight.grad(), expected, 1e-5);
    });
    REQUIRE(lt::joined(problems).empty());
  }
}

TEST_CASE("DDP: a parameter with no gradient on one rank only fails every rank, naming it and "
          "the rank",
          "[ddp]") {
  // Head b left out of forward on rank 1, without find_unused_parameters:
  // the rank without it never launches its bucket, so the others waited in
  // that bucket's all-reduce until the group's timeout, told nothing of why.
  const auto batch = lt::global_batch(9, 4);
  const std::string backend = GENERATE(as<std::string>(), "shm", lt::kThreadRankBackend);
  const auto problems = lt::on_ranks(3, [&](int r, auto group) -> std::string {
    const auto local = lt::shard(batch, r, 3);
    auto model = std::make_shared<TwoHeads>(1);
    model->use_b = r != 1;
    DistributedDataParallel ddp(model, group);
    lt::loss_of(ddp, local).backward();
    return "no error";
  }, "ddp", backend);
  INFO(backend << "\n" << lt::joined(problems));
  REQUIRE_THAT(problems[1], Catch::Contains("DistributedDataParallel on rank 1: 2 "
                                            "parameter(s) received no gradient") &&
                                Catch::Contains("'b.weight', 'b.bias'") &&
                                Catch::Contains("the group is unusable now"));
  for (const int r : {0, 2}) {
    REQUIRE_THAT(problems[static_cast<size_t>(r)],
                 Catch::Contains("all-reduce of gradient bucket") &&
                     Catch::Contains("received no gradient in this backward on that rank") &&
                     Catch::Contains("rank 1 called barrier()") &&
                     !Catch::Contains("timed out"));
  }
}

TEST_CASE("DDP: with find_unused_parameters, an output that one rank's loss leaves out counts "
          "as that rank's zeros in the average",
          "[ddp]") {
  // The search walks from the tensor backward started from, so head b, which
  // rank 1's loss does not use, is unused there (PyTorch walks from every
  // output forward returned and fails the step).
  const auto batch = lt::global_batch(9, 4);
  using lockstep::runtime::add;
  using lockstep::runtime::cross_entropy;
  auto alone = std::make_shared<TwoOutputs>(1);
  Tensor sum_of_losses;
  for (int r = 0; r < 3; ++r) {
    const auto local = lt::shard(batch, r, 3);
    const nn::Values out = alone->forward_values({local.x});
    Tensor loss = cross_entropy(out.tensor(0), local.y);
    if (r != 1) loss = add(loss, cross_entropy(out.tensor(1), local.y));
    sum_of_losses = sum_of_losses.defined() ? add(sum_of_losses, loss) : loss;
  }
  lockstep::runtime::mul(sum_of_losses, 1.0 / 3).backward();  // the average of the ranks'
  const std::string backend = GENERATE(as<std::string>(), "shm", lt::kThreadRankBackend);
  const auto problems = lt::on_ranks(3, [&](int r, auto group) -> std::string {
    auto model = std::make_shared<TwoOutputs>(1);
    DistributedDataParallel ddp(model, group, DdpOptions{.find_unused_parameters = true});
    const auto local = lt::shard(batch, r, 3);
    const nn::Values out = ddp.forward_values({local.x});
    Tensor loss = cross_entropy(out.tensor(0), local.y);
    if (r != 1) loss = add(loss, cross_entropy(out.tensor(1), local.y));
    loss.backward();
    const auto mine = model->named_parameters(), theirs = alone->named_parameters();
    for (size_t i = 0; i < mine.size(); ++i) {
      auto problem = lt::mismatch(mine[i].first, mine[i].second.grad(), theirs[i].second.grad(),
                                  1e-5);
      if (!problem.empty()) return problem;
    }
    return "";
  }, "ddp", backend);
  INFO(backend);
  CHECK(lt::joined(problems) == "");
}

TEST_CASE("DDP: with static_graph, an output the loss stops using is named as the cause",
          "[ddp]") {
  // The first iteration used both heads, which fixes the used set; the
  // second leaves head b out. Telling the user to turn on
  // find_unused_parameters, already on, would lead nowhere.
  const auto batch = lt::global_batch(8, 4);
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    DistributedDataParallel ddp(
        std::make_shared<TwoOutputs>(1), group,
        DdpOptions{.find_unused_parameters = true, .static_graph = true});
    const auto local = lt::shard(batch, r, 2);
    const nn::Values first = ddp.forward_values({local.x});
    lockstep::runtime::add(lockstep::runtime::cross_entropy(first.tensor(0), local.y),
                           lockstep::runtime::cross_entropy(first.tensor(1), local.y))
        .backward();
    const nn::Values out = ddp.forward_values({local.x});
    lockstep::runtime::cross_entropy(out.tensor(0), local.y).backward();
    return "no error";
  });
  for (const auto& p : problems) {
    REQUIRE_THAT(p, Catch::Contains("received no gradient") && Catch::Contains("'b.weight'") &&
                        !Catch::Contains(".find_unused_parameters = true") &&
                        Catch::Contains("construct DDP without static_graph"));
  }
}

TEST_CASE("DDP: static_graph names a parameter that the first iteration left unused and a "
          "later one uses, with static_graph as the cause",
          "[ddp]") {
  // It was marked ready from the kept walk; the error said it got two
  // gradients and that find_unused_parameters found it unreachable.
  const auto batch = lt::global_batch(8, 5);
  for (const bool find_unused : {false, true}) {
    const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
      auto model = std::make_shared<TwoHeads>(1);
      DistributedDataParallel ddp(
          model, group, DdpOptions{.find_unused_parameters = find_unused, .static_graph = true});
      const auto local = lt::shard(batch, r, 2);
      model->use_b = false;
      lt::loss_of(ddp, local).backward();
      model->use_b = true;
      lt::loss_of(ddp, local).backward();
      return "no error";
    });
    INFO("find_unused_parameters " << find_unused);
    for (const auto& p : problems) {
      REQUIRE_THAT(p, Catch::Contains("parameter 'b.") &&
                          Catch::Contains("Construct DDP without static_graph") &&
                          !Catch::Contains("marked ready twice") &&
                          !Catch::Contains("found it unreachable"));
    }
  }
}

// A gate whose custom backward passes no gradient back to its parameter
// (an op that treats it as a constant in backward): the parameter is
// reachable from the loss, yet its gradient never comes.
class GatedHead : public nn::Module {
 public:
  explicit GatedHead(uint64_t seed) {
    lockstep::runtime::Generator g(seed);
    a = register_module("a", std::make_shared<nn::Linear>(12, 5, true, g));
    gate = register_parameter("gate", Tensor::full({5}, 0.5));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = a->forward(x), scale = gate.detach();
    return lockstep::runtime::record(
        lockstep::runtime::mul(h.detach(), scale), "Gate", {h, gate}, {},
        [scale](const lockstep::runtime::BackwardArgs& args) {
          return std::vector<Tensor>{lockstep::runtime::mul(args.grad, scale), Tensor()};
        });
  }
  std::shared_ptr<nn::Linear> a;
  Tensor gate;
};

TEST_CASE("DDP: with find_unused_parameters, a parameter the loss reaches but that gets no "
          "gradient (a custom backward passed none) counts as unused, as in PyTorch",
          "[ddp]") {
  // It used to fail the step: "reachable from the tensor this backward
  // started from, yet no gradient came to them".
  const auto batch = lt::global_batch(8, 4);
  auto alone = std::make_shared<GatedHead>(1);
  lt::loss_of(*alone, batch).backward();
  std::vector<Tensor> expected;
  for (const auto& named : alone->named_parameters()) expected.push_back(named.second.grad());
  REQUIRE_FALSE(alone->gate.grad().defined());
  const bool static_graph = GENERATE(false, true);
  INFO("static_graph " << static_graph);
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    auto model = std::make_shared<GatedHead>(1);
    DistributedDataParallel ddp(
        model, group, DdpOptions{.find_unused_parameters = true, .static_graph = static_graph});
    const auto local = lt::shard(batch, r, 2);
    for (int step = 0; step < 2; ++step) {  // static_graph: the kept walk, then without one
      model->zero_grad();
      lt::loss_of(ddp, local).backward();
      const std::string problem = lt::grads_mismatch(*model, expected, 1e-5);
      if (!problem.empty()) return fmt::format("step {}: {}", step, problem);
    }
    return "";
  });
  CHECK(lt::joined(problems) == "");
}

// Head b runs without history in forward; its backward recomputes it with
// history and backpropagates it on its own, inside the outer backward (a
// reentrant checkpoint, written by hand).
class ReentrantHead : public nn::Module {
 public:
  ReentrantHead() {
    lockstep::runtime::Generator g(1);
    a = register_module("a", std::make_shared<nn::Linear>(12, 8, true, g));
    b = register_module("b", std::make_shared<nn::Linear>(8, 5, true, g));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = a->forward(x);
    Tensor out;
    {
      lockstep::runtime::NoGradGuard no_grad;
      out = b->forward(h);
    }
    return lockstep::runtime::record(
        out, "Reentrant", {h}, {h}, [head = b](const lockstep::runtime::BackwardArgs& args) {
          lockstep::runtime::set_grad_enabled(true);
          Tensor in = args.saved[0].detach().requires_grad_(true);
          head->forward(in).backward(args.grad);
          lockstep::runtime::set_grad_enabled(false);
          return std::vector<Tensor>{in.grad()};
        });
  }
  std::shared_ptr<nn::Linear> a, b;
};

TEST_CASE("DDP: a custom backward that runs a backward of its own inside the outer one (a "
          "reentrant checkpoint) equals one process",
          "[ddp]") {
  // The iteration ended with the inner backward, before a's gradients came:
  // "'a.weight', 'a.bias' received no gradient" (with find_unused_parameters:
  // "received a gradient, but no ddp.forward() ran").
  const auto batch = lt::global_batch(8, 4);
  auto alone = std::make_shared<ReentrantHead>();
  lt::loss_of(*alone, batch).backward();
  std::vector<Tensor> expected;
  for (const auto& named : alone->named_parameters()) expected.push_back(named.second.grad());
  const bool find_unused = GENERATE(false, true);
  INFO("find_unused_parameters " << find_unused);
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    auto model = std::make_shared<ReentrantHead>();
    DistributedDataParallel ddp(model, group, DdpOptions{.find_unused_parameters = find_unused});
    const auto local = lt::shard(batch, r, 2);
    for (int step = 0; step < 2; ++step) {
      model->zero_grad();
      lt::loss_of(ddp, local).backward();
      const std::string problem = lt::grads_mismatch(*model, expected, 1e-5);
      if (!problem.empty()) return fmt::format("step {}: {}", step, problem);
    }
    return "";
  });
  CHECK(lt::joined(problems) == "");
}

TEST_CASE("DDP: a parameter reached outside forward's output is averaged, and a second backward "
          "per forward is named",
          "[ddp]") {
  const auto batch = lt::global_batch(8, 4);
  SECTION("reached outside forward's output: averaged like any other gradient") {
    // The search walks from the loss, which reaches b.weight through the
    // extra term only (PyTorch walks from forward's output, counts it
    // unused, and fails when its gradient comes).
    const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
      auto model = std::make_shared<TwoHeads>(1);
      model->use_b = false;
      DistributedDataParallel ddp(model, group, DdpOptions{.find_unused_parameters = true});
      Tensor loss = lt::loss_of(ddp, lt::shard(batch, r, 2));
      lockstep::runtime::add(loss, lockstep::runtime::sum(model->b->weight)).backward();
      // Each rank's gradient of the extra term is all ones; so is their average.
      if (model->b->bias.grad().defined()) return "b.bias, reached by no loss, got a gradient";
      return lt::mismatch("b.weight.grad", model->b->weight.grad(),
                          Tensor::ones(model->b->weight.shape()), 1e-6);
    });
    REQUIRE(lt::joined(problems) == "");
  }
  SECTION("two backward passes through one forward") {
    const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
      DistributedDataParallel ddp(lt::small_mlp(1), group);
      Tensor loss = lt::loss_of(ddp, lt::shard(batch, r, 2));
      loss.backward({}, /*retain_graph=*/true);
      loss.backward();
      return "no error";
    });
    for (const auto& p : problems) {
      REQUIRE_THAT(p, Catch::Contains("parameter '4.") && Catch::Contains("no ddp.forward() ran"));
    }
  }
}

TEST_CASE("DDP: a forward under no_grad between a forward and its backward leaves the "
          "iteration to the first",
          "[ddp]") {
  // As PyTorch: an evaluation, or targets computed under no_grad, between a
  // forward and its backward; the backward averages as if it had not run.
  const auto batch = lt::global_batch(8, 4);
  for (const bool find_unused : {false, true}) {
    const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
      auto model = std::make_shared<TwoHeads>(1);
      DistributedDataParallel ddp(model, group,
                                  DdpOptions{.find_unused_parameters = find_unused});
      const auto local = lt::shard(batch, r, 2);
      Tensor out = ddp.forward(local.x);
      {
        lockstep::runtime::NoGradGuard no_grad;
        model->use_b = false;  // head b unused here: must not count as unused below
        (void)ddp.forward(local.x);
        model->use_b = true;
      }
      lockstep::runtime::cross_entropy(out, local.y).backward();
      auto alone = std::make_shared<TwoHeads>(1);
      lt::loss_of(*alone, batch).backward();
      const auto mine = ddp.module().named_parameters(), theirs = alone->named_parameters();
      for (size_t i = 0; i < mine.size(); ++i) {
        const auto m = lt::mismatch(mine[i].first, mine[i].second.grad(),
                                    theirs[i].second.grad(), 1e-5);
        if (!m.empty()) return m;
      }
      return "";
    });
    INFO("find_unused_parameters " << find_unused);
    REQUIRE(lt::joined(problems).empty());
  }
}

TEST_CASE("DDP: a forward never backpropagated (an evaluation with grad mode on, on every rank "
          "or on rank 0 only) leaves the next training step right",
          "[ddp]") {
  // The next forward replaces the one never backpropagated (no gradient of
  // it reached the reducer), whose unused head b must not count as unused in
  // the step that uses it; ranks that skipped it take part alike.
  const auto batch = lt::global_batch(8, 4);
  auto alone = std::make_shared<TwoHeads>(1);
  lt::loss_of(*alone, batch).backward();
  const auto theirs = alone->named_parameters();
  for (const bool find_unused : {false, true}) {
    for (const bool rank0_only : {false, true}) {
      const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
        auto model = std::make_shared<TwoHeads>(1);
        DistributedDataParallel ddp(model, group,
                                    DdpOptions{.find_unused_parameters = find_unused});
        const auto local = lt::shard(batch, r, 2);
        if (r == 0 || !rank0_only) {
          ddp.eval();
          model->use_b = false;
          (void)lockstep::runtime::cross_entropy(ddp.forward(local.x), local.y);
          model->use_b = true;
          ddp.train();
        }
        lt::loss_of(ddp, local).backward();
        const auto mine = ddp.module().named_parameters();
        for (size_t i = 0; i < mine.size(); ++i) {
          const auto m = lt::mismatch(mine[i].first, mine[i].second.grad(),
                                      theirs[i].second.grad(), 1e-5);
          if (!m.empty()) return m;
        }
        return "";
      });
      INFO("find_unused_parameters " << find_unused << ", rank 0 only " << rank0_only);
      CHECK(lt::joined(problems).empty());
    }
  }
}

TEST_CASE("DDP: after the first iteration buckets follow the order gradients became ready",
          "[ddp]") {
  const auto batch = lt::global_batch(8, 6);
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    // b is registered first but used last, so its gradients are ready first;
    // reverse registration order guesses wrong.
    auto model = std::make_shared<TwoHeads>(1, /*register_b_first=*/true);
    DistributedDataParallel ddp(model, group,
                                DdpOptions{.bucket_cap_mb = 1e-4, .first_bucket_cap_mb = 1e-4});
    if (ddp.buckets().front().names.front() != "a.bias") return "unexpected initial order";
    for (int step = 0; step < 2; ++step) {
      ddp.zero_grad();
      lt::loss_of(ddp, lt::shard(batch, r, 2)).backward();
      if (ddp.buckets().front().names.front() != "b.bias") {
        return fmt::format("after step {} the first bucket starts with {}", step,
                           ddp.buckets().front().names.front());
      }
    }
    // Gradients are still right after the rebuild.
    auto alone = std::make_shared<TwoHeads>(1, true);
    const auto full = lt::global_batch(8, 6);
    lt::loss_of(*alone, full).backward();
    return lt::mismatch("a.weight.grad", model->a->weight.grad(), alone->a->weight.grad(), 1e-5);
  });
  REQUIRE(lt::joined(problems).empty());
}

TEST_CASE("DDP: statistics are printable and JSON", "[ddp]") {
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    DistributedDataParallel ddp(lt::small_mlp(1), group);
    lt::loss_of(ddp, lt::shard(lt::global_batch(8, 1), r, 2)).backward();
    const auto& s = ddp.stats();
    if (s.iteration != 1 || s.bucket_bytes.size() != 1) return "unexpected stats: " + s.str();
    if (s.comm_ms < 0 || s.exposed_comm_ms < 0 || s.backward_ms < 0) return "negative times";
    const std::string json = s.to_json();
    if (json.find("\"bucket_bytes\": [") == std::string::npos) return "JSON lacks bucket_bytes: " + json;
    if (s.str().find("iteration 1") == std::string::npos) return "str: " + s.str();
    return "";
  });
  REQUIRE(lt::joined(problems).empty());
}

TEST_CASE("DDP: static_graph walks the graph once and gives the same gradients", "[ddp]") {
  const auto batch = lt::global_batch(8, 12);
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    auto plain = std::make_shared<TwoHeads>(1), fixed = std::make_shared<TwoHeads>(1);
    plain->use_b = fixed->use_b = false;
    DistributedDataParallel a(plain, group, DdpOptions{.find_unused_parameters = true});
    DistributedDataParallel b(fixed, group,
                              DdpOptions{.find_unused_parameters = true, .static_graph = true});
    for (int step = 0; step < 3; ++step) {
      a.zero_grad();
      b.zero_grad();
      lt::loss_of(a, lt::shard(batch, r, 2)).backward();
      lt::loss_of(b, lt::shard(batch, r, 2)).backward();
      if (!lt::bitwise_equal(plain->a->weight.grad(), fixed->a->weight.grad())) {
        return fmt::format("step {}: static_graph changed a gradient", step);
      }
      if (fixed->b->weight.grad().defined()) return "an unused head got a gradient";
    }
    return "";
  });
  REQUIRE(lt::joined(problems).empty());
}

TEST_CASE("DDP: hooks sit on every trained parameter and leave with the wrapper", "[ddp]") {
  const auto batch = lt::global_batch(8, 13);
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    auto model = lt::small_mlp(1);
    {
      lockstep::runtime::NoGradGuard no_grad;
      model->parameters()[0].requires_grad_(false);  // frozen: no hook, no bucket slot
    }
    {
      DistributedDataParallel ddp(model, group);
      size_t slots = 0;
      for (const auto& b : ddp.buckets()) slots += b.names.size();
      if (slots != model->parameters().size() - 1) return fmt::format("{} bucket slots", slots);
      lt::loss_of(ddp, lt::shard(batch, r, 2)).backward();
      if (ddp.stats().iteration != 1) return "the reducer did not run";
    }
    // The wrapper is gone: a plain backward is local again (no hook throws
    // for the missing forward, nothing is averaged).
    model->zero_grad();
    lt::loss_of(*model, lt::shard(batch, r, 2)).backward();
    auto alone = lt::small_mlp(1);
    lt::loss_of(*alone, lt::shard(batch, r, 2)).backward();
    return lt::mismatch("local grad", model->parameters()[2].grad(), alone->parameters()[2].grad(), 0);
  });
  REQUIRE(lt::joined(problems).empty());
}

TEST_CASE("DDP: verify_every finds a parameter changed on one rank, names it and the rank, on "
          "every rank",
          "[ddp]") {
  const auto problems = lt::on_ranks(3, [](int r, auto group) -> std::string {
    auto model = lt::small_mlp(1);
    DistributedDataParallel ddp(model, group, DdpOptions{.verify_every = 2});
    const auto batch = lt::shard(lt::global_batch(12, 5), r, 3);
    auto train_step = [&] {
      lt::loss_of(ddp, batch).backward();
      lockstep::runtime::NoGradGuard no_grad;
      for (const Tensor& p : ddp.parameters()) Tensor(p).add_(p.grad(), -0.1);
      for (const Tensor& p : ddp.parameters()) Tensor(p).set_grad(Tensor{});
    };
    train_step();  // forward #1: no check
    train_step();  // forward #2: checked, identical
    if (r == 2) {  // "I changed a parameter on one GPU"
      lockstep::runtime::NoGradGuard no_grad;
      Tensor(model->named_parameters()[2].second).mul_(1.0 + 1e-6);
    }
    train_step();  // forward #3: no check
    std::string error;
    try {
      train_step();  // forward #4: checked
    } catch (const lockstep::Error& e) {
      error = e.what();
    }
    if (error.empty()) return "the divergence was not caught";
    const std::string name = model->named_parameters()[2].first;
    for (const std::string& part : {"'" + name + "'", std::string("rank 2 holds other bits"),
                                    std::string("before training forward #4")})
      if (error.find(part) == std::string::npos) return "no \"" + part + "\" in: " + error;
    // The group is still in step: re-broadcasting rank 0's parameters heals it.
    ddp.broadcast_parameters();
    for (const Tensor& p : ddp.parameters()) Tensor(p).set_grad(Tensor{});
    train_step();  // #5
    train_step();  // #6: checked, identical again
    return "";
  });
  for (const auto& p : problems) CHECK(p == "");
}

TEST_CASE("DDP: verify_every must not be negative", "[ddp]") {
  const auto problems = lt::on_ranks(2, [](int, auto group) -> std::string {
    try {
      DistributedDataParallel ddp(lt::small_mlp(1), group, DdpOptions{.verify_every = -1});
    } catch (const lockstep::Error& e) {
      return std::string(e.what()).find("verify_every must be >= 0") != std::string::npos
                 ? ""
                 : e.what();
    }
    return "constructed";
  });
  for (const auto& p : problems) CHECK(p == "");
}

TEST_CASE("DDP: a module with nothing to train is refused, as PyTorch refuses it", "[ddp]") {
  const auto problems = lt::on_ranks(2, [](int, auto group) -> std::string {
    auto frozen = lt::small_mlp(1);
    for (auto& p : frozen->parameters()) p.requires_grad_(false);
    for (const auto& module : {std::shared_ptr<nn::Module>(std::make_shared<nn::ReLU>()),
                               std::shared_ptr<nn::Module>(frozen)}) {
      try {
        DistributedDataParallel ddp(module, group);
        return "constructed";
      } catch (const lockstep::Error& e) {
        if (std::string(e.what()).find("no parameter that requires a gradient") ==
            std::string::npos)
          return e.what();
      }
    }
    return "";
  });
  for (const auto& p : problems) CHECK(p == "");
}
