// DDP in programs with several models or several forwards per step: two
// towers of one model called apart, a GAN's generator and discriminator,
// two models' losses summed; gradients compared with one process on the
// whole batch; in-process over gloo.
#include <catch2/catch.hpp>

#include "lockstep/nn/join.h"
#include "lockstep/runtime/data/loader.h"
#include "lockstep/runtime/ops/loss.h"
#include "lockstep/runtime/ops/misc.h"
#include "lockstep/runtime/ops/reduce.h"
#include "nn/ddp/ddp_fixture.h"
#include "support/test_util.h"

namespace lt = lockstep::testing;
namespace nn = lockstep::nn;
namespace rt = lockstep::runtime;
using lockstep::nn::DdpOptions;
using lockstep::nn::DistributedDataParallel;
using lockstep::runtime::Tensor;

namespace {

// Two encoders in one module (a CLIP-style model): the input's width picks
// the tower, so a step calls forward once per tower.
class TwoTowers : public nn::Module {
 public:
  explicit TwoTowers(uint64_t seed) {
    rt::Generator g(seed);
    image = register_module("image", std::make_shared<nn::Linear>(12, 5, true, g));
    text = register_module("text", std::make_shared<nn::Linear>(8, 5, true, g));
  }
  Tensor forward(const Tensor& x) override {
    return x.size(1) == 12 ? image->forward(x) : text->forward(x);
  }
  std::shared_ptr<nn::Linear> image, text;
};

struct TwoInputs {
  Tensor images, texts, labels;
};

TwoInputs two_inputs(int64_t rows) {
  rt::Generator g(5);
  std::vector<int64_t> y(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) y[static_cast<size_t>(i)] = i % 5;
  return {rt::randn({rows, 12}, rt::DType::f32, g), rt::randn({rows, 8}, rt::DType::f32, g),
          Tensor::from_vector(y, {rows})};
}

TwoInputs rows_of(const TwoInputs& in, int rank, int n) {
  const int64_t rows = in.images.size(0), lo = rows * rank / n, hi = rows * (rank + 1) / n;
  return {in.images.slice(0, lo, hi).contiguous(), in.texts.slice(0, lo, hi).contiguous(),
          in.labels.slice(0, lo, hi).contiguous()};
}

Tensor two_tower_loss(nn::Module& m, const TwoInputs& in) {
  Tensor a = m.forward(in.images);
  Tensor b = m.forward(in.texts);
  return rt::add(rt::cross_entropy(a, in.labels), rt::cross_entropy(b, in.labels));
}

std::vector<Tensor> grads_of(nn::Module& m) {
  std::vector<Tensor> out;
  for (const auto& [name, p] : m.named_parameters())
    out.push_back(p.grad().defined() ? p.grad().clone() : Tensor{});  // none: a tower unused
  return out;
}

}  // namespace

TEST_CASE("DDP: two forwards through different parameters, one loss over both, equal one "
          "process, with find_unused_parameters and static_graph too",
          "[ddp][multimodel]") {
  const auto all = two_inputs(8);
  auto alone = std::make_shared<TwoTowers>(3);
  two_tower_loss(*alone, all).backward();
  const auto expected = grads_of(*alone);
  const auto [find_unused, static_graph] = GENERATE(table<bool, bool>({{false, false},
                                                                        {true, false},
                                                                        {true, true},
                                                                        {false, true}}));
  INFO("find_unused_parameters " << find_unused << ", static_graph " << static_graph);
  const auto problems = lt::on_ranks(2, [&](int rank, auto group) -> std::string {
    auto model = std::make_shared<TwoTowers>(3);
    DistributedDataParallel ddp(model, group,
                                {.find_unused_parameters = find_unused, .static_graph = static_graph});
    for (int step = 0; step < 2; ++step) {
      model->zero_grad();
      two_tower_loss(ddp, rows_of(all, rank, 2)).backward();
      auto problem = lt::grads_mismatch(*model, expected, 1e-5);
      if (!problem.empty()) return fmt::format("step {}: {}", step, problem);
    }
    return "";
  });
  CHECK(lt::joined(problems) == "");
}

namespace {

std::shared_ptr<nn::Sequential> generator(uint64_t seed) {
  rt::Generator g(seed);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(4, 12, true, g));
  return m;
}

struct GanGrads {
  std::vector<Tensor> discriminator, generator;
};

// One DCGAN-style step: the discriminator on real rows and on detached
// fakes, then the generator's loss through the discriminator, whose
// parameters are frozen for it or whose gradients from it are zeroed.
GanGrads gan_step(nn::Module& g, nn::Module& d, nn::Module& g_params, nn::Module& d_params,
                  const Tensor& real, const Tensor& noise, bool freeze_discriminator) {
  const int64_t rows = real.size(0);
  const Tensor ones = Tensor::ones({rows, 5}), zeros = Tensor::zeros({rows, 5});
  d_params.zero_grad();
  Tensor fake = g.forward(noise);
  rt::add(rt::mse_loss(d.forward(real), ones), rt::mse_loss(d.forward(fake.detach()), zeros))
      .backward();
  GanGrads out;
  out.discriminator = grads_of(d_params);
  g_params.zero_grad();
  d_params.zero_grad();
  for (Tensor& p : d_params.parameters()) p.requires_grad_(!freeze_discriminator);
  rt::mse_loss(d.forward(fake), ones).backward();
  for (Tensor& p : d_params.parameters()) p.requires_grad_(true);
  out.generator = grads_of(g_params);
  return out;
}

}  // namespace

TEST_CASE("DDP: a GAN's two wrapped models trained alternately equal one process, the "
          "discriminator frozen for the generator's step or not",
          "[ddp][multimodel]") {
  rt::Generator data(9);
  const Tensor real = rt::randn({8, 12}, rt::DType::f32, data);
  const Tensor noise = rt::randn({8, 4}, rt::DType::f32, data);
  auto g_alone = generator(1);
  auto d_alone = lt::small_mlp(2);
  const auto expected = gan_step(*g_alone, *d_alone, *g_alone, *d_alone, real, noise, false);
  const bool find_unused = GENERATE(false, true);
  const bool freeze = GENERATE(false, true);
  INFO("find_unused_parameters " << find_unused << ", discriminator frozen " << freeze);
  const auto problems = lt::on_ranks(2, [&](int rank, auto group) -> std::string {
    auto g = generator(1);
    auto d = lt::small_mlp(2);
    DistributedDataParallel g_ddp(g, group, {.find_unused_parameters = find_unused});
    DistributedDataParallel d_ddp(d, group, {.find_unused_parameters = find_unused});
    for (int step = 0; step < 2; ++step) {
      const auto got = gan_step(g_ddp, d_ddp, *g, *d, real.slice(0, rank * 4, rank * 4 + 4).contiguous(),
                                noise.slice(0, rank * 4, rank * 4 + 4).contiguous(), freeze);
      for (size_t i = 0; i < got.discriminator.size(); ++i) {
        auto p = lt::mismatch(fmt::format("step {} D grad {}", step, i), got.discriminator[i],
                              expected.discriminator[i], 1e-5);
        if (!p.empty()) return p;
      }
      for (size_t i = 0; i < got.generator.size(); ++i) {
        auto p = lt::mismatch(fmt::format("step {} G grad {}", step, i), got.generator[i],
                              expected.generator[i], 1e-5);
        if (!p.empty()) return p;
      }
    }
    return "";
  });
  CHECK(lt::joined(problems) == "");
}

TEST_CASE("DDP: two wrapped models' losses summed and backpropagated once equal one process",
          "[ddp][multimodel]") {
  const auto batch = lt::global_batch(8, 4);
  auto a_alone = lt::small_mlp(1), b_alone = lt::small_mlp(2);
  rt::add(lt::loss_of(*a_alone, batch), lt::loss_of(*b_alone, batch)).backward();
  const auto expected_a = grads_of(*a_alone), expected_b = grads_of(*b_alone);
  const bool find_unused = GENERATE(false, true);
  const auto problems = lt::on_ranks(2, [&](int rank, auto group) -> std::string {
    auto a = lt::small_mlp(1), b = lt::small_mlp(2);
    DistributedDataParallel a_ddp(a, group, {.find_unused_parameters = find_unused});
    DistributedDataParallel b_ddp(b, group, {.find_unused_parameters = find_unused});
    const auto mine = lt::shard(batch, rank, 2);
    for (int step = 0; step < 2; ++step) {
      a->zero_grad();
      b->zero_grad();
      rt::add(lt::loss_of(a_ddp, mine), lt::loss_of(b_ddp, mine)).backward();
      auto p = lt::grads_mismatch(*a, expected_a, 1e-5);
      if (p.empty()) p = lt::grads_mismatch(*b, expected_b, 1e-5);
      if (!p.empty()) return fmt::format("step {}: {}", step, p);
    }
    return "";
  });
  CHECK(lt::joined(problems) == "");
}

TEST_CASE("DDP: a model frozen whole on one rank only fails every rank at once, naming the "
          "freeze",
          "[ddp][multimodel]") {
  // Rank 0's forward has nothing to average and starts no bucket; rank 1's
  // buckets would have paired with rank 0's next backward, one iteration
  // apart, without a word (a model without buffers: no broadcast to differ).
  const auto batch = lt::global_batch(8, 4);
  const auto problems = lt::on_ranks(2, [&](int rank, auto group) -> std::string {
    auto model = lt::small_mlp(2);
    DistributedDataParallel ddp(model, group);
    for (Tensor& p : model->parameters()) p.requires_grad_(rank != 0);
    Tensor x = lt::shard(batch, rank, 2).x.clone().requires_grad_();
    rt::sum(ddp.forward(x)).backward();
    return "no error";
  });
  INFO(lt::joined(problems));
  CHECK_THAT(problems[0], Catch::Contains("every parameter of the wrapped model frozen") &&
                              Catch::Contains("on every rank alike"));
  CHECK_THAT(problems[1], Catch::Contains("rank 0 called barrier()") &&
                              !Catch::Contains("timed out"));
}

TEST_CASE("DDP: an input's gradient through a model frozen whole in eval mode, on rank 0 "
          "alone, waits for no other rank",
          "[ddp][multimodel]") {
  // A saliency map or an adversarial input on rank 0 only; then both ranks
  // train a step, unfrozen, as if it had not happened.
  const auto batch = lt::global_batch(8, 4);
  auto alone = lt::small_mlp(2);
  lt::loss_of(*alone, batch).backward();
  std::vector<Tensor> expected;
  for (const Tensor& p : alone->parameters()) expected.push_back(p.grad().clone());
  const auto problems = lt::on_ranks(2, [&](int rank, auto group) -> std::string {
    auto model = lt::small_mlp(2);
    DistributedDataParallel ddp(model, group);
    if (rank == 0) {
      ddp.eval();
      for (Tensor& p : model->parameters()) p.requires_grad_(false);
      Tensor x = lt::shard(batch, 0, 2).x.clone().requires_grad_();
      rt::sum(ddp.forward(x)).backward();
      if (!x.grad().defined()) return "the input got no gradient";
      for (Tensor& p : model->parameters()) p.requires_grad_(true);
      ddp.train();
    }
    lt::loss_of(ddp, lt::shard(batch, rank, 2)).backward();
    return lt::grads_mismatch(*model, expected, 1e-5);
  });
  CHECK(lt::joined(problems) == "");
}

TEST_CASE("DDP: a GAN's two wrapped models under one Join, ranks of 1 and 2 batches, equal one "
          "process on the active ranks' rows",
          "[ddp][multimodel][join]") {
  // Rows 0-3 are rank 0's one batch; rows 4-11 rank 1's two. Each row pairs
  // a real sample with the generator's noise.
  rt::Generator data(9);
  const Tensor real = rt::randn({12, 12}, rt::DType::f32, data);
  const Tensor noise = rt::randn({12, 4}, rt::DType::f32, data);
  auto rows = [&](const Tensor& t, int64_t lo, int64_t hi) { return t.slice(0, lo, hi).contiguous(); };
  std::vector<GanGrads> expected;
  for (const auto& active_rows : std::vector<std::vector<int64_t>>{{0, 4, 4, 8}, {8, 12}}) {
    std::vector<Tensor> r, z;
    for (size_t i = 0; i < active_rows.size(); i += 2) {
      r.push_back(rows(real, active_rows[i], active_rows[i + 1]));
      z.push_back(rows(noise, active_rows[i], active_rows[i + 1]));
    }
    auto g = generator(1);
    auto d = lt::small_mlp(2);
    expected.push_back(gan_step(*g, *d, *g, *d, rt::cat(r, 0), rt::cat(z, 0), false));
  }
  const bool freeze = GENERATE(false, true);
  INFO("discriminator frozen " << freeze);
  const auto problems = lt::on_ranks(2, [&](int rank, auto group) -> std::string {
    auto g = generator(1);
    auto d = lt::small_mlp(2);
    DistributedDataParallel g_ddp(g, group), d_ddp(d, group);
    const int64_t lo = rank == 0 ? 0 : 4, hi = rank == 0 ? 4 : 12;
    rt::TensorDataset mine(rows(real, lo, hi), rows(noise, lo, hi));
    rt::DataLoader loader(mine, {.batch_size = 4});
    nn::Join join(*group);
    size_t step = 0;
    for (const rt::Batch& b : join.batches(loader)) {
      const auto got = gan_step(g_ddp, d_ddp, *g, *d, b.x, b.y, freeze);
      for (size_t i = 0; i < got.discriminator.size(); ++i) {
        auto p = lt::mismatch(fmt::format("step {} D grad {}", step, i), got.discriminator[i],
                              expected[step].discriminator[i], 1e-5);
        if (!p.empty()) return p;
      }
      for (size_t i = 0; i < got.generator.size(); ++i) {
        auto p = lt::mismatch(fmt::format("step {} G grad {}", step, i), got.generator[i],
                              expected[step].generator[i], 1e-5);
        if (!p.empty()) return p;
      }
      ++step;
    }
    return step == 2 ? "" : fmt::format("{} steps", step);
  });
  CHECK(lt::joined(problems) == "");
}

TEST_CASE("DDP: a loss over a forward and a no_sync forward after it through other parameters "
          "is averaged whole, with find_unused_parameters too",
          "[ddp][multimodel]") {
  const auto all = two_inputs(8);
  auto alone = std::make_shared<TwoTowers>(3);
  two_tower_loss(*alone, all).backward();
  const auto expected = grads_of(*alone);
  const bool find_unused = GENERATE(false, true);
  INFO("find_unused_parameters " << find_unused);
  const auto problems = lt::on_ranks(2, [&](int rank, auto group) -> std::string {
    auto model = std::make_shared<TwoTowers>(3);
    DistributedDataParallel ddp(model, group, {.find_unused_parameters = find_unused});
    const auto mine = rows_of(all, rank, 2);
    Tensor images = ddp.forward(mine.images);
    Tensor texts;
    {
      auto guard = ddp.no_sync();
      texts = ddp.forward(mine.texts);
    }
    rt::add(rt::cross_entropy(images, mine.labels), rt::cross_entropy(texts, mine.labels))
        .backward();
    return lt::grads_mismatch(*model, expected, 1e-5);
  });
  CHECK(lt::joined(problems) == "");
}

TEST_CASE("DDP: a forward kept but never backpropagated leaves out of the unused-parameter "
          "search the parameters that only it used, as in PyTorch",
          "[ddp][multimodel]") {
  // A step skipped after its forward (a NaN loss, a batch judged bad) whose
  // output is still held when the next forward runs, through a model whose
  // parameters in use change with the input (experts, towers): the next
  // backward reaches the text tower only, and the image tower's gradients
  // never come. Its search must say so, or the buckets wait for them.
  const auto all = two_inputs(8);
  auto alone = std::make_shared<TwoTowers>(3);
  rt::cross_entropy(alone->forward(all.texts), all.labels).backward();
  const auto expected = grads_of(*alone);
  const bool static_graph = GENERATE(false, true);
  INFO("static_graph " << static_graph);
  const auto problems = lt::on_ranks(2, [&](int rank, auto group) -> std::string {
    auto model = std::make_shared<TwoTowers>(3);
    DistributedDataParallel ddp(model, group,
                                {.find_unused_parameters = true, .static_graph = static_graph});
    const auto mine = rows_of(all, rank, 2);
    Tensor skipped = ddp.forward(mine.images);  // its loss was not finite: no backward
    Tensor texts = ddp.forward(mine.texts);
    rt::cross_entropy(texts, mine.labels).backward();
    return lt::grads_mismatch(*model, expected, 1e-5);
  });
  CHECK(lt::joined(problems) == "");
}

TEST_CASE("DDP: a module shared by two wrapped models is refused, saying to wrap one module "
          "that holds both",
          "[ddp][multimodel]") {
  const auto problems = lt::on_ranks(2, [&](int rank, auto group) -> std::string {
    rt::Generator g(1);
    auto shared = std::make_shared<nn::Linear>(12, 12, true, g);
    auto a = std::make_shared<nn::Sequential>(), b = std::make_shared<nn::Sequential>();
    a->push_back(shared);
    a->push_back(std::make_shared<nn::Linear>(12, 5, true, g));
    b->push_back(shared);
    b->push_back(std::make_shared<nn::Linear>(12, 5, true, g));
    DistributedDataParallel a_ddp(a, group), b_ddp(b, group);
    const auto mine = lt::shard(lt::global_batch(8, 4), rank, 2);
    const std::string error = lt::error_of([&] { lt::loss_of(a_ddp, mine).backward(); });
    for (const char* part : {"parameter '0.weight'", "newer DistributedDataParallel",
                             "one module that holds both"}) {
      if (error.find(part) == std::string::npos)
        return "no \"" + std::string(part) + "\" in: " + error;
    }
    return "";
  });
  CHECK(lt::joined(problems) == "");
}
