// DDP's static_graph and find_unused_parameters around forwards that no
// backward follows: an evaluation with grad mode on, before training or
// between its steps; in-process over gloo.
#include <catch2/catch.hpp>

#include "lockstep/distributed/flight_recorder.h"
#include "nn/ddp/ddp_fixture.h"

namespace lt = lockstep::testing;
namespace nn = lockstep::nn;
using lockstep::nn::DdpOptions;
using lockstep::nn::DistributedDataParallel;
using lockstep::runtime::Tensor;

namespace {

// A main head, and a second one used in training only (an auxiliary loss
// head) or in evaluation only.
class SecondHead : public nn::Module {
 public:
  SecondHead(uint64_t seed, bool in_training) : in_training_(in_training) {
    lockstep::runtime::Generator g(seed);
    a = register_module("a", std::make_shared<nn::Linear>(12, 5, true, g));
    b = register_module("b", std::make_shared<nn::Linear>(5, 5, true, g));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = a->forward(x);
    return is_training() == in_training_ ? b->forward(h) : h;
  }
  std::shared_ptr<nn::Linear> a, b;

 private:
  bool in_training_;
};

// "" when every parameter's .grad matches the one-process gradient on the
// whole batch.
std::string compare_with_one_process(nn::Module& mine, nn::Module& alone, const lt::Batch& batch) {
  alone.zero_grad();
  lt::loss_of(alone, batch).backward();
  const auto m = mine.named_parameters(), a = alone.named_parameters();
  for (size_t i = 0; i < m.size(); ++i) {
    if (!a[i].second.grad().defined()) {
      if (m[i].second.grad().defined()) return m[i].first + " got a gradient it should not";
      continue;
    }
    const auto p = lt::mismatch(m[i].first, m[i].second.grad(), a[i].second.grad(), 1e-5);
    if (!p.empty()) return p;
  }
  return "";
}

}  // namespace

TEST_CASE("DDP: static_graph learns the used parameters from the first backward, not from an "
          "evaluation forward before it",
          "[ddp]") {
  // A validation loss computed with grad mode on before training starts:
  // its graph has no backward, and may use other parameters than training.
  const auto batch = lt::global_batch(8, 21);
  for (const bool aux_in_training : {true, false}) {
    for (const bool eval_on_every_rank : {true, false}) {
      const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
        auto model = std::make_shared<SecondHead>(1, aux_in_training);
        DistributedDataParallel ddp(
            model, group, DdpOptions{.find_unused_parameters = true, .static_graph = true});
        const auto local = lt::shard(batch, r, 2);
        if (eval_on_every_rank || r == 0) {
          ddp.eval();
          (void)lt::loss_of(ddp, local);  // grad mode on, no backward
          ddp.train();
        }
        auto alone = std::make_shared<SecondHead>(1, aux_in_training);
        for (int step = 0; step < 3; ++step) {
          ddp.zero_grad();
          lt::loss_of(ddp, local).backward();
          const auto p = compare_with_one_process(ddp.module(), *alone, batch);
          if (!p.empty()) return fmt::format("step {}: {}", step, p);
        }
        return "";
      });
      INFO("aux head in training " << aux_in_training << ", eval on every rank "
                                   << eval_on_every_rank);
      CHECK(lt::joined(problems) == "");
    }
  }
}

TEST_CASE("DDP: static_graph alone trains a model with a parameter no iteration uses, as "
          "PyTorch, and all-reduces which were used in its first averaged backward only",
          "[ddp]") {
  // PyTorch: with a static graph it does not matter whether
  // find_unused_parameters is set. Here the head used in evaluation only
  // got no gradient, and every backward failed naming it.
  const auto batch = lt::global_batch(8, 23);
  const std::string name = "ddp-static-alone";
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    auto model = std::make_shared<SecondHead>(1, false);
    DistributedDataParallel ddp(model, group, DdpOptions{.static_graph = true});
    auto alone = std::make_shared<SecondHead>(1, false);
    for (int step = 0; step < 4; ++step) {
      ddp.zero_grad();
      lt::loss_of(ddp, lt::shard(batch, r, 2)).backward();
      const auto p = compare_with_one_process(ddp.module(), *alone, batch);
      if (!p.empty()) return fmt::format("step {}: {}", step, p);
    }
    return "";
  }, name);
  CHECK(lt::joined(problems) == "");
  // The used map's all-reduce (one i32 per parameter) runs once: the first
  // averaged backward says which parameters every later one uses. Taking
  // static_graph for find_unused_parameters had added it to every step.
  int used_maps = 0;
  for (const auto& record : lockstep::distributed::FlightRecorder::instance().snapshot())
    if (record.group == name && record.group_rank == 0 && record.op == "allreduce" &&
        record.dtype == "i32")
      ++used_maps;
  CHECK(used_maps == 1);
}

TEST_CASE("DDP: an evaluation forward with grad mode on between training steps changes no "
          "gradient",
          "[ddp]") {
  const auto batch = lt::global_batch(8, 22);
  struct Mode {
    bool find_unused, static_graph, aux_in_training;
  };
  // Without find_unused_parameters or static_graph training must use every
  // parameter.
  for (const Mode mode : {Mode{false, false, true}, Mode{false, true, true},
                          Mode{false, true, false}, Mode{true, false, true},
                          Mode{true, false, false},
                          Mode{true, true, true}, Mode{true, true, false}}) {
    for (const bool eval_on_every_rank : {true, false}) {
      const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
        auto model = std::make_shared<SecondHead>(1, mode.aux_in_training);
        DistributedDataParallel ddp(model, group,
                                    DdpOptions{.find_unused_parameters = mode.find_unused,
                                               .static_graph = mode.static_graph});
        const auto local = lt::shard(batch, r, 2);
        auto alone = std::make_shared<SecondHead>(1, mode.aux_in_training);
        for (int step = 0; step < 3; ++step) {
          if (step == 1 && (eval_on_every_rank || r == 0)) {
            ddp.eval();
            (void)lt::loss_of(ddp, local);
            ddp.train();
          }
          ddp.zero_grad();
          lt::loss_of(ddp, local).backward();
          const auto p = compare_with_one_process(ddp.module(), *alone, batch);
          if (!p.empty()) return fmt::format("step {}: {}", step, p);
        }
        return "";
      });
      INFO("find_unused " << mode.find_unused << ", static_graph " << mode.static_graph
                          << ", aux head in training " << mode.aux_in_training
                          << ", eval on every rank " << eval_on_every_rank);
      CHECK(lt::joined(problems) == "");
    }
  }
}

namespace {

// forward returns a tensor that needs no gradient when asked (predictions
// of a model under evaluation, taken with grad mode on).
class Detachable : public nn::Module {
 public:
  explicit Detachable(uint64_t seed) : inner(lt::small_mlp(seed)) {
    register_module("inner", inner);
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = inner->forward(x);
    return detach ? y.detach() : y;
  }
  std::shared_ptr<nn::Sequential> inner;
  bool detach = false;
};

}  // namespace

TEST_CASE("DDP: a forward whose outputs need no gradient, between a forward and its backward, "
          "leaves the iteration to the first",
          "[ddp]") {
  // As a forward under no_grad: no backward can follow it, so the backward
  // of the forward before it must still average (and, after no_sync(), be
  // accumulated and then averaged by the next one).
  const auto batch = lt::global_batch(8, 23);
  for (const bool find_unused : {false, true}) {
    for (const bool accumulate : {false, true}) {
      const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
        auto model = std::make_shared<Detachable>(1);
        DistributedDataParallel ddp(model, group,
                                    DdpOptions{.find_unused_parameters = find_unused});
        const auto local = lt::shard(batch, r, 2);
        auto step = [&] {
          Tensor out = ddp.forward(local.x);
          model->detach = true;
          (void)ddp.forward(local.x);  // grad mode on, nothing to differentiate
          model->detach = false;
          lockstep::runtime::mul(lockstep::runtime::cross_entropy(out, local.y),
                                 accumulate ? 0.5 : 1.0)
              .backward();
        };
        if (accumulate) {
          auto guard = ddp.no_sync();
          step();
        }
        step();
        auto alone = lt::small_mlp(1);
        return compare_with_one_process(*model->inner, *alone, batch);
      });
      INFO("find_unused_parameters " << find_unused << ", no_sync first " << accumulate);
      CHECK(lt::joined(problems) == "");
    }
  }
}
