// Activation checkpointing of modules: nn::Checkpoint and
// GptConfig::checkpoint_blocks give the plain model's loss, gradients and
// generator state bit for bit, use less memory, and train identically under
// DDP (with and without find_unused_parameters) and DataParallel.
#include <catch2/catch.hpp>

#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "lockstep/models/models.h"
#include "lockstep/nn/checkpoint.h"
#include "lockstep/nn/data_parallel.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/runtime/autograd/checkpoint.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/cpu/host_cache.h"
#include "nn/ddp/ddp_fixture.h"
#include "support/test_util.h"
#include "support/tokens.h"

namespace lt = lockstep::testing;
namespace nn = lockstep::nn;
namespace lr = lockstep::runtime;
namespace models = lockstep::models;
using lr::Device;
using lr::Tensor;

using lockstep::testing::tokens;

namespace {


models::GptConfig small(bool checkpointed, double dropout = 0.1) {
  return {.vocab_size = 40, .block_size = 16, .n_layer = 3, .n_head = 2, .n_embd = 32,
          .dropout = dropout, .checkpoint_blocks = checkpointed};
}


struct GptRun {
  Tensor loss;
  nn::NamedList<Tensor> grads;
  uint64_t offset;
};

GptRun gpt_step(const models::GptConfig& config) {
  const auto [idx, targets] = tokens(3, 12, config.vocab_size, 2);
  auto model = models::gpt(config, 7);
  lr::manual_seed(21);
  const Tensor loss = model->forward_values({idx, targets}).tensor(1);
  loss.backward();
  GptRun r{loss, {}, lr::default_generator().offset()};
  for (const auto& [name, p] : model->named_parameters()) r.grads.emplace_back(name, p.grad());
  return r;
}

}  // namespace

TEST_CASE("checkpoint: a GPT with checkpointed blocks gives the plain loss and gradients bit for bit",
          "[nn][checkpoint][gpt]") {
  const GptRun plain = gpt_step(small(false)), ckpt = gpt_step(small(true));
  CHECK(lockstep::testing::bitwise_equal(plain.loss, ckpt.loss));
  REQUIRE(plain.grads.size() == ckpt.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    INFO(plain.grads[i].first);
    CHECK(plain.grads[i].first == ckpt.grads[i].first);
    REQUIRE(plain.grads[i].second.defined());
    CHECK(lockstep::testing::bitwise_equal(plain.grads[i].second, ckpt.grads[i].second));
  }
  // Dropout drew, and the recomputation moved no generator.
  CHECK(plain.offset > 0);
  CHECK(plain.offset == ckpt.offset);
}

TEST_CASE("checkpoint: checkpoint_blocks keeps nanoGPT's parameter names", "[nn][checkpoint][gpt]") {
  CHECK(models::gpt(small(true), 1)->state_dict().keys() ==
        models::gpt(small(false), 1)->state_dict().keys());
}

TEST_CASE("checkpoint: nn::Checkpoint prefixes names with module. and matches the plain module",
          "[nn][checkpoint]") {
  const auto make = [] {
    lr::Generator g(4);
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::Linear>(6, 10, true, g));
    m->push_back(std::make_shared<nn::GELU>());
    m->push_back(std::make_shared<nn::Dropout>(0.3, 17));  // its own generator
    m->push_back(std::make_shared<nn::Linear>(10, 3, true, g));
    return m;
  };
  auto plain = make();
  auto wrapped = std::make_shared<nn::Checkpoint>(make());
  CHECK(wrapped->named_parameters().front().first == "module.0.weight");
  CHECK(wrapped->state_dict().size() == plain->state_dict().size());

  lr::Generator g(8);
  const Tensor x = lr::randn({5, 6}, lr::DType::f32, g);
  lr::sum(lr::mul((*plain)(x), (*plain)(x))).backward();
  // Through forward_values, with a non-tensor passing through.
  const nn::Values out = wrapped->forward_values({x});
  REQUIRE(out.size() == 1);
  const Tensor y = out.tensor(0);
  const Tensor y2 = (*wrapped)(x);
  lr::sum(lr::mul(y, y2)).backward();
  const auto a = plain->parameters(), b = wrapped->parameters();
  for (size_t i = 0; i < a.size(); ++i) CHECK(lockstep::testing::bitwise_equal(a[i].grad(), b[i].grad()));
  // The dropout generators stand where they stand without checkpointing.
  lr::NoGradGuard no_grad;
  CHECK(lockstep::testing::bitwise_equal((*plain)(x), (*wrapped)(x)));
}

TEST_CASE("checkpoint: a checkpointed GPT's forward peaks lower in host memory, as predicted",
          "[nn][checkpoint][gpt][memory]") {
  // B = 8, T = 64, C = 64, 4 blocks: N = B*T*C = 32768 floats = 128 KiB.
  // Without checkpointing each block keeps, in f32: c_attn's input (N), q, k,
  // v (3N), attention's output (N), c_proj's input (N), ln_2's input (N),
  // c_fc's input (N), GELU's input (4N) and mlp.c_proj's input (4N): 16N, or
  // 2 MiB. With it a block keeps its input alone (kept anyway as ln_1's
  // input), so the forward's peak should drop by about 16N per block, less
  // the one block whose activations live while it runs (at most 16N):
  // between 3 and 4 blocks' worth, 6-8 MiB. Dropout masks are kept in both.
  const models::GptConfig base{.vocab_size = 64, .block_size = 64, .n_layer = 4, .n_head = 4,
                           .n_embd = 64, .dropout = 0.1};
  const auto [idx, targets] = tokens(8, 64, base.vocab_size, 3);
  const auto peak_of = [&](bool checkpointed) {
    models::GptConfig c = base;
    c.checkpoint_blocks = checkpointed;
    auto model = models::gpt(c, 1);
    lr::cpu::reset_host_peak();
    const size_t before = lr::cpu::host_cache_stats().in_use_bytes;
    const Tensor loss = model->forward_values({idx, targets}).tensor(1);
    const size_t peak = lr::cpu::host_cache_stats().peak_bytes - before;
    loss.backward();
    return peak;
  };
  const double plain = static_cast<double>(peak_of(false));
  const double ckpt = static_cast<double>(peak_of(true));
  const double n_bytes = 8.0 * 64 * 64 * 4, predicted = 16 * n_bytes * 3.5;
  const double saved = plain - ckpt;
  INFO(fmt::format("forward peak: plain {:.2f} MiB, checkpointed {:.2f} MiB, saved {:.2f} MiB, "
                   "predicted {:.2f} MiB",
                   plain / (1 << 20), ckpt / (1 << 20), saved / (1 << 20), predicted / (1 << 20)));
  CHECK(saved > predicted / 1.5);
  CHECK(saved < predicted * 1.5);
}

TEST_CASE("checkpoint: a checkpointed GPT trains as the plain one under DDP at 2 ranks",
          "[nn][checkpoint][gpt][ddp]") {
  for (const bool find_unused : {false, true}) {
    INFO("find_unused_parameters " << find_unused);
    const auto train = [&](bool checkpointed) {
      std::vector<std::vector<Tensor>> params(2);
      const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
        // No dropout: the rank threads would share the default generator.
        auto model = models::gpt(small(checkpointed, 0.0), 5);
        nn::DistributedDataParallel ddp(model, group, {.find_unused_parameters = find_unused});
        lockstep::optim::SGD sgd(model->parameters(), {.lr = 0.1});
        for (int step = 0; step < 3; ++step) {
          const auto [idx, targets] = tokens(2, 9, 40, static_cast<uint64_t>(10 * step + r));
          sgd.zero_grad();
          ddp.forward_values({idx, targets}).tensor(1).backward();
          sgd.step();
        }
        for (const Tensor& p : model->parameters()) params[static_cast<size_t>(r)].push_back(p.clone());
        return "";
      });
      for (const auto& p : problems) CHECK(p == "");
      return params;
    };
    const auto plain = train(false), ckpt = train(true);
    for (size_t r = 0; r < 2; ++r) {
      REQUIRE(plain[r].size() == ckpt[r].size());
      for (size_t i = 0; i < plain[r].size(); ++i) CHECK(lockstep::testing::bitwise_equal(plain[r][i], ckpt[r][i]));
    }
  }
}

TEST_CASE("checkpoint: DataParallel CPU replicas recompute on their own lanes",
          "[nn][checkpoint][gpt][data_parallel]") {
  const auto [idx, targets] = tokens(4, 7, 40, 4);
  const auto grads = [&](bool checkpointed) {
    auto model = models::gpt(small(checkpointed, 0.0), 6);
    nn::DataParallel dp(model, {Device::cpu(), Device::cpu()});
    lr::mean(dp.forward_values({idx, targets}).tensor(1)).backward();
    std::vector<Tensor> out;
    for (const Tensor& p : model->parameters()) out.push_back(p.grad());
    return out;
  };
  const auto plain = grads(false), ckpt = grads(true);
  for (size_t i = 0; i < plain.size(); ++i) CHECK(lockstep::testing::bitwise_equal(plain[i], ckpt[i]));
}

TEST_CASE("checkpoint: a checkpointed BatchNorm updates its running statistics once a step",
          "[nn][checkpoint]") {
  // The recomputation in backward runs the BatchNorm's forward again; its
  // statistics must not be counted twice.
  const auto momentum = GENERATE(std::optional<double>(0.1), std::optional<double>());
  auto plain = std::make_shared<nn::BatchNorm1d>(2, nn::BatchNormOptions{.momentum = momentum});
  auto inner = std::make_shared<nn::BatchNorm1d>(2, nn::BatchNormOptions{.momentum = momentum});
  auto wrapped = std::make_shared<nn::Checkpoint>(inner);
  lr::Generator g(3);
  for (int step = 0; step < 2; ++step) {
    const Tensor x = lr::randn({4, 2}, lr::DType::f32, g).requires_grad_();
    lr::sum(lr::mul((*plain)(x), x)).backward();
    lr::sum(lr::mul((*wrapped)(x), x)).backward();
  }
  for (const char* name : {"running_mean", "running_var", "num_batches_tracked"}) {
    INFO(name);
    CHECK(lt::bitwise_equal(plain->state_dict().at(name), inner->state_dict().at(name)));
  }
  CHECK(lt::bitwise_equal(plain->weight.grad(), inner->weight.grad()));
}

TEST_CASE("checkpoint: a BatchNorm forwarded twice before one backward is no error",
          "[nn][checkpoint]") {
  // The second forward updates the running statistics the first one read;
  // the recomputation in training mode does not read them, so the check on
  // what a region's function captured must not refuse it.
  auto plain = std::make_shared<nn::BatchNorm1d>(2);
  auto wrapped = std::make_shared<nn::Checkpoint>(std::make_shared<nn::BatchNorm1d>(2));
  lr::Generator g(3);
  const Tensor a = lr::randn({4, 2}, lr::DType::f32, g), b = lr::randn({4, 2}, lr::DType::f32, g);
  const auto loss = [&](nn::Module& m) {
    return lr::add(lr::sum(lr::mul(m(a), a)), lr::sum(lr::mul(m(b), b)));
  };
  loss(*plain).backward();
  loss(*wrapped).backward();
  CHECK(lt::bitwise_equal(plain->weight.grad(), wrapped->module->parameters()[0].grad()));
}

TEST_CASE("checkpoint: a DDP-wrapped model checkpointed whole averages the plain gradients",
          "[nn][checkpoint][ddp]") {
  // The recomputation in backward reruns ddp.forward; it must not prepare a
  // second iteration from the recomputed graph, in which no parameter is
  // reachable (find_unused_parameters would call them all unused).
  const lt::Batch batch = lt::global_batch(8, 3);
  auto reference = lt::small_mlp(1);
  lt::loss_of(*reference, batch).backward();
  for (const bool find_unused : {false, true}) {
    INFO("find_unused_parameters " << find_unused);
    std::vector<std::vector<Tensor>> grads(2);
    const auto problems = lt::on_ranks(
        2,
        [&](int r, auto group) -> std::string {
          auto model = lt::small_mlp(1);
          nn::DistributedDataParallel ddp(model, group, {.find_unused_parameters = find_unused});
          const lt::Batch shard = lt::shard(batch, r, 2);
          for (int step = 0; step < 2; ++step) {
            for (Tensor p : model->parameters()) p.set_grad({});
            const Tensor out =
                lr::checkpoint([&ddp](const Tensor& x) { return ddp.forward(x); }, shard.x);
            lr::cross_entropy(out, shard.y).backward();
          }
          auto& mine = grads[static_cast<size_t>(r)];
          for (const Tensor& p : model->parameters()) mine.push_back(p.grad());
          return "";
        },
        "ckpt_ddp_whole", "shm");
    REQUIRE(lt::joined(problems) == "");
    const auto expected = reference->parameters();
    for (size_t r = 0; r < 2; ++r) {
      REQUIRE(grads[r].size() == expected.size());
      for (size_t i = 0; i < expected.size(); ++i)
        CHECK(lt::mismatch(fmt::format("rank {} grad {}", r, i), grads[r][i], expected[i].grad(),
                           1e-5) == "");
    }
  }
}
