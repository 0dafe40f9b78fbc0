// DDP in the combinations people train with, against one process on the
// concatenated batch over several steps (DESIGN.md's promises 1 and 5): no_sync()
// accumulation, clip_grad_norm (the global batch's norm on every rank), SGD with
// nesterov momentum, AdamW and ZeRO over parameter groups of their own lr and
// weight decay, a OneCycle schedule, GradScaler, the compression hooks, a tied
// embedding and output layer, frozen parameters and parameters unused on some
// steps or ranks; a GPT with checkpointed blocks under bf16 autocast; and
// SyncBatchNorm on even and uneven shards, running statistics included. The
// first two also compare the ranks' parameters with each other, bit for bit.
// Over shm, whose DDP buckets live in the group's shared pool.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <optional>

#include "nn/ddp/ddp_fixture.h"
#include "lockstep/models/gpt.h"
#include "lockstep/models/models.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/module.h"
#include "lockstep/nn/normalization.h"
#include "lockstep/nn/sync_batch_norm.h"
#include "lockstep/optim/adam.h"
#include "lockstep/optim/clip_grad.h"
#include "lockstep/optim/grad_scaler.h"
#include "lockstep/optim/lr_scheduler.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/optim/zero_redundancy_optimizer.h"
#include "lockstep/runtime/autocast.h"
#include "support/tied_model.h"
#include "support/tokens.h"

namespace lt = lockstep::testing;
namespace lr = lockstep::runtime;
using lockstep::nn::DdpOptions;
using lockstep::runtime::Tensor;
namespace optim = lockstep::optim;
namespace nn = lockstep::nn;

namespace {

struct Ids {
  Tensor x, y;
};

Ids ids_batch(int64_t rows, uint64_t seed) {
  std::vector<int64_t> x, y;
  for (int64_t i = 0; i < rows; ++i) {
    for (int j = 0; j < 3; ++j) x.push_back((i * 3 + j * 7 + static_cast<int64_t>(seed) * 5) % 10);
    y.push_back((i * 7 + static_cast<int64_t>(seed)) % 10);
  }
  return {Tensor::from_vector(x, {rows, 3}), Tensor::from_vector(y, {rows})};
}

Ids ids_shard(const Ids& b, int rank, int n) {
  const int64_t rows = b.x.size(0);
  const int64_t lo = rows * rank / n, hi = rows * (rank + 1) / n;
  return {b.x.slice(0, lo, hi).contiguous(), b.y.slice(0, lo, hi).contiguous()};
}

// A tied embedding and output layer, a frozen layer beside a trained one, an
// aux layer used on some steps only (on every rank), and a vector `rare` used
// only by rows whose first id is 9 (on the ranks that hold such a row).
class Branchy : public nn::Module {
 public:
  explicit Branchy(uint64_t seed) {
    lr::Generator g(seed);
    emb = register_module("emb", std::make_shared<nn::Embedding>(10, 4, g));
    frozen = register_module("frozen", std::make_shared<nn::Linear>(12, 4, true, g));
    for (Tensor& p : frozen->parameters()) p.requires_grad_(false);
    trained = register_module("trained", std::make_shared<nn::Linear>(12, 4, true, g));
    aux = register_module("aux", std::make_shared<nn::Linear>(4, 4, true, g));
    rare = register_parameter("rare", lr::randn({4}, lr::DType::f32, g));
    head = register_module("head", std::make_shared<nn::Linear>(emb->weight));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor flat = emb->forward(x).reshape({x.size(0), 12});
    Tensor h = lr::add(frozen->forward(flat), trained->forward(flat));
    if (use_aux) h = lr::add(h, aux->forward(h));
    std::vector<float> mask;
    bool any = false;
    const auto ids = x.to_vector<int64_t>();
    for (int64_t i = 0; i < x.size(0); ++i) {
      mask.push_back(ids[static_cast<size_t>(i * 3)] == 9 ? 1.0f : 0.0f);
      any = any || mask.back() != 0;
    }
    if (any) h = lr::add(h, lr::mul(Tensor::from_vector(mask, {x.size(0), 1}), rare));
    return head->forward(h);
  }
  std::shared_ptr<nn::Embedding> emb;
  std::shared_ptr<nn::Linear> frozen, trained, aux, head;
  Tensor rare;
  bool use_aux = true;
};

std::vector<optim::ParamGroup> groups_of(nn::Module& m) {
  // The tied weight (the first parameter) in a group of its own.
  auto params = m.parameters();
  std::vector<Tensor> rest(params.begin() + 1, params.end());
  return {{.params = rest, .options = {}},
          {.params = {params[0]}, .options = {{"lr", 0.02}, {"weight_decay", 0.0}}}};
}

std::unique_ptr<optim::Optimizer> make_opt(std::vector<optim::ParamGroup> groups, int kind) {
  if (kind == 0) {
    return std::make_unique<optim::SGD>(
        groups, optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3,
                                  .nesterov = true});
  }
  optim::AdamWOptions o;
  o.lr = 0.01;
  return std::make_unique<optim::AdamW>(groups, o);
}

}  // namespace

TEST_CASE("DDP combinations: a tied weight, no_sync accumulation, clipping and grouped "
          "optimizers match one process on the concatenated batch",
          "[ddp][equivalence]") {
  // A table rather than the full product (over a thousand runs): each option
  // meets each other one somewhere. f16 is left without a GradScaler, whose
  // scaled sums it cannot hold (the scaler would skip the steps the f32
  // reference takes, as PyTorch's does).
  struct Case {
    int world;
    int opt;  // 0: SGD nesterov, 1: AdamW, 2: ZeRO over SGD, 3: ZeRO over AdamW
    int micro;
    int hook;  // 0: none, 1: fp16, 2: bf16
    bool scaled, branchy, find_unused, bucket_view;
  };
  const Case c = GENERATE(values<Case>({{2, 0, 3, 0, false, true, true, false},
                                        {3, 1, 3, 0, true, true, true, true},
                                        {4, 2, 3, 2, true, true, true, false},
                                        {3, 3, 3, 0, true, true, true, true},
                                        {2, 3, 1, 1, false, true, true, true},
                                        {4, 1, 3, 1, false, false, false, true},
                                        {2, 2, 1, 0, true, false, true, false},
                                        {3, 0, 3, 2, true, false, false, true},
                                        {4, 3, 3, 0, false, false, false, false},
                                        {3, 2, 3, 1, false, true, true, false},
                                        {4, 0, 1, 0, true, true, true, true},
                                        {2, 1, 3, 2, false, false, true, false}}));
  const int world = c.world, opt_kind = c.opt, micro = c.micro, hook = c.hook;
  const bool scaled = c.scaled, branchy = c.branchy, find_unused = c.find_unused,
             bucket_view = c.bucket_view;
  INFO("world " << world << " opt " << opt_kind << " micro " << micro << " hook " << hook
                << " scaled " << scaled << " branchy " << branchy << " find_unused "
                << find_unused << " bucket_view " << bucket_view);
  constexpr int kSteps = 3;
  constexpr int64_t kRows = 12;
  const double tol = hook == 0 ? 2e-5 : 5e-2;
  // One process: each micro-batch's mean loss over the whole global batch.
  const auto make = [&]() -> std::shared_ptr<nn::Module> {
    if (branchy) return std::make_shared<Branchy>(7);
    return lockstep::testing::tied_embedding_model(7);
  };
  // Branchy's aux layer on every other micro-batch, alike on every rank.
  const auto use_aux = [&](nn::Module& m, bool on) {
    if (auto* b = dynamic_cast<Branchy*>(&m)) b->use_aux = on;
  };
  auto ref = make();
  REQUIRE(ref->parameters().size() == (branchy ? 8u : 3u));
  auto ref_opt = make_opt(groups_of(*ref), opt_kind % 2);
  optim::GradScaler ref_scaler(optim::GradScalerOptions{.enabled = scaled});
  const optim::OneCycleLROptions cycle{.max_lr = 0.05, .total_steps = kSteps, .pct_start = 0.5};
  optim::OneCycleLR ref_sched(*ref_opt, cycle);
  std::vector<double> ref_norms;
  for (int step = 0; step < kSteps; ++step) {
    ref_opt->zero_grad();
    for (int k = 0; k < micro; ++k) {
      const Ids b = ids_batch(kRows, static_cast<uint64_t>(step * 10 + k));
      use_aux(*ref, (step + k) % 2 == 0);
      ref_scaler.scale(lr::cross_entropy(ref->forward(b.x), b.y)).backward();
    }
    ref_scaler.unscale_(*ref_opt);
    ref_norms.push_back(optim::clip_grad_norm(ref->parameters(), 0.5));
    ref_scaler.step(*ref_opt);
    ref_scaler.update();
    ref_sched.step();
  }
  std::vector<std::vector<float>> bits(static_cast<size_t>(world));
  const auto problems = lt::on_ranks(world, [&](int rank, auto group) -> std::string {
    auto model = make();
    nn::DistributedDataParallel ddp(
        model, group,
        DdpOptions{.find_unused_parameters = find_unused, .gradient_as_bucket_view = bucket_view});
    if (hook == 1) ddp.register_comm_hook(nn::comm_hooks::fp16_compress());
    if (hook == 2) ddp.register_comm_hook(nn::comm_hooks::bf16_compress());
    std::unique_ptr<optim::Optimizer> opt;
    optim::ZeroRedundancyOptimizer* zero = nullptr;
    if (opt_kind >= 2) {
      const int inner = opt_kind % 2;
      auto z = std::make_unique<optim::ZeroRedundancyOptimizer>(
          groups_of(*model), group,
          [inner](std::vector<optim::ParamGroup> g) { return make_opt(std::move(g), inner); });
      zero = z.get();
      opt = std::move(z);
    } else {
      opt = make_opt(groups_of(*model), opt_kind);
    }
    optim::GradScaler scaler(group, optim::GradScalerOptions{.enabled = scaled});
    optim::OneCycleLR sched(*opt, cycle);
    for (int step = 0; step < kSteps; ++step) {
      opt->zero_grad();
      for (int k = 0; k < micro; ++k) {
        const Ids b =
            ids_shard(ids_batch(kRows, static_cast<uint64_t>(step * 10 + k)), rank, world);
        use_aux(*model, (step + k) % 2 == 0);
        if (k + 1 < micro) {
          auto guard = ddp.no_sync();
          scaler.scale(lr::cross_entropy(ddp.forward(b.x), b.y)).backward();
        } else {
          scaler.scale(lr::cross_entropy(ddp.forward(b.x), b.y)).backward();
        }
      }
      scaler.unscale_(*opt);
      const double norm = zero ? zero->clip_grad_norm(0.5)
                               : optim::clip_grad_norm(model->parameters(), 0.5);
      const double want = ref_norms[static_cast<size_t>(step)];
      if (std::abs(norm - want) > tol * want)
        return fmt::format("step {}: norm {} vs {}", step, norm, want);
      scaler.step(*opt);
      scaler.update();
      sched.step();
    }
    const auto ps = model->parameters(), rs = ref->parameters();
    for (size_t i = 0; i < ps.size(); ++i) {
      const auto m = lt::mismatch(fmt::format("param {}", i), ps[i], rs[i], tol);
      if (!m.empty()) return m;
      for (float v : ps[i].to_vector<float>()) bits[static_cast<size_t>(rank)].push_back(v);
    }
    return "";
  }, "combo", "shm");
  REQUIRE(lt::joined(problems) == "");
  for (int r = 1; r < world; ++r) {
    CHECK(std::memcmp(bits[0].data(), bits[static_cast<size_t>(r)].data(),
                      bits[0].size() * sizeof(float)) == 0);
  }
}

TEST_CASE("DDP combinations: a GPT (tied wte and lm_head, checkpointed blocks, autocast) "
          "under no_sync, clipping and AdamW matches one process on the concatenated batch",
          "[ddp][equivalence][gpt]") {
  const int world = GENERATE(2, 3);
  const bool checkpointed = GENERATE(false, true);
  const bool amp = GENERATE(false, true);
  // No options change what is computed: these two ride along.
  const bool find_unused = checkpointed != amp;
  const bool bucket_view = world == 3;
  const int micro = amp ? 2 : 1 + (world == 2);
  INFO("world " << world << " checkpointed " << checkpointed << " find_unused " << find_unused
                << " bucket_view " << bucket_view << " amp " << amp << " micro " << micro);
  const lockstep::models::GptConfig config{.vocab_size = 40, .block_size = 16, .n_layer = 2,
                                           .n_head = 2, .n_embd = 16, .dropout = 0.0,
                                           .checkpoint_blocks = checkpointed};
  constexpr int kSteps = 3;
  const int64_t rows = 6;
  const double tol = amp ? 3e-2 : 5e-5;
  const auto loss_of = [&](nn::Module& m, const Tensor& idx, const Tensor& targets) {
    std::optional<lr::AutocastGuard> guard;
    if (amp) guard.emplace(lr::AutocastState{.enabled = true, .dtype = lr::DType::bf16});
    return m.forward_values({idx, targets}).tensor(1);
  };
  auto ref = lockstep::models::gpt(config, 5);
  optim::AdamW ref_opt(ref->parameters(), optim::AdamWOptions{});
  std::vector<double> ref_norms;
  for (int step = 0; step < kSteps; ++step) {
    ref_opt.zero_grad();
    for (int k = 0; k < micro; ++k) {
      const auto [idx, targets] = lt::tokens(rows, 8, 40, static_cast<uint64_t>(step * 10 + k));
      loss_of(*ref, idx, targets).backward();
    }
    ref_norms.push_back(optim::clip_grad_norm(ref->parameters(), 1.0));
    ref_opt.step();
  }
  std::vector<std::vector<float>> bits(static_cast<size_t>(world));
  const auto problems = lt::on_ranks(world, [&](int rank, auto group) -> std::string {
    auto model = lockstep::models::gpt(config, 5);
    nn::DistributedDataParallel ddp(
        model, group,
        DdpOptions{.find_unused_parameters = find_unused, .gradient_as_bucket_view = bucket_view});
    optim::AdamW opt(model->parameters(), optim::AdamWOptions{});
    for (int step = 0; step < kSteps; ++step) {
      opt.zero_grad();
      for (int k = 0; k < micro; ++k) {
        const auto [idx, targets] = lt::tokens(rows, 8, 40, static_cast<uint64_t>(step * 10 + k));
        const int64_t lo = rows * rank / world, hi = rows * (rank + 1) / world;
        const Tensor x = idx.slice(0, lo, hi).contiguous();
        const Tensor y = targets.slice(0, lo, hi).contiguous();
        if (k + 1 < micro) {
          auto guard = ddp.no_sync();
          loss_of(ddp, x, y).backward();
        } else {
          loss_of(ddp, x, y).backward();
        }
      }
      const double norm = optim::clip_grad_norm(model->parameters(), 1.0);
      const double want = ref_norms[static_cast<size_t>(step)];
      if (std::abs(norm - want) > tol * want)
        return fmt::format("step {}: norm {} vs {}", step, norm, want);
      opt.step();
    }
    const auto ps = model->named_parameters();
    const auto rs = ref->parameters();
    for (size_t i = 0; i < ps.size(); ++i) {
      const auto m = lt::mismatch(ps[i].first, ps[i].second, rs[i], tol);
      if (!m.empty()) return m;
      for (float v : ps[i].second.to_vector<float>()) bits[static_cast<size_t>(rank)].push_back(v);
    }
    return "";
  }, "combo-gpt", "shm");
  REQUIRE(lt::joined(problems) == "");
  for (int r = 1; r < world; ++r) {
    CHECK(std::memcmp(bits[0].data(), bits[static_cast<size_t>(r)].data(),
                      bits[0].size() * sizeof(float)) == 0);
  }
}

TEST_CASE("DDP combinations: SyncBatchNorm under no_sync accumulation and momentum SGD "
          "matches BatchNorm in one process on the concatenated batch, even and uneven",
          "[ddp][equivalence][syncbn]") {
  const int world = GENERATE(2, 3, 4);
  const int64_t rows = GENERATE(12, 13);
  const bool bucket_view = (world + rows) % 2 == 0;
  const bool find_unused = world == 3;
  const int micro = rows == 13 ? 3 : 1 + 2 * (world == 4);
  INFO("world " << world << " rows " << rows << " bucket_view " << bucket_view << " find_unused "
                << find_unused << " micro " << micro);
  constexpr int kSteps = 3;
  const auto make = [] {
    lr::Generator g(11);
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::Linear>(12, 16, true, g));
    m->push_back(std::make_shared<nn::BatchNorm1d>(16));
    m->push_back(std::make_shared<nn::ReLU>());
    m->push_back(std::make_shared<nn::Linear>(16, 5, true, g));
    return m;
  };
  auto ref = make();
  optim::SGD ref_opt(ref->parameters(),
                     optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
  for (int step = 0; step < kSteps; ++step) {
    ref_opt.zero_grad();
    for (int k = 0; k < micro; ++k) {
      const lt::Batch b = lt::global_batch(rows, static_cast<uint64_t>(step * 10 + k));
      lr::cross_entropy(ref->forward(b.x), b.y).backward();
    }
    ref_opt.step();
  }
  const auto problems = lt::on_ranks(world, [&](int rank, auto group) -> std::string {
    std::shared_ptr<nn::Module> model = nn::convert_sync_batchnorm(make(), group);
    nn::DistributedDataParallel ddp(
        model, group,
        DdpOptions{.find_unused_parameters = find_unused, .gradient_as_bucket_view = bucket_view});
    optim::SGD opt(model->parameters(),
                   optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
    for (int step = 0; step < kSteps; ++step) {
      opt.zero_grad();
      for (int k = 0; k < micro; ++k) {
        const lt::Batch b =
            lt::shard(lt::global_batch(rows, static_cast<uint64_t>(step * 10 + k)), rank, world);
        // Each rank's mean weighted by its share, so that DDP's average is
        // the mean over the global batch when the shards are uneven.
        const double share = static_cast<double>(b.x.size(0) * world) / static_cast<double>(rows);
        const auto loss = [&] { return lr::mul(lr::cross_entropy(ddp.forward(b.x), b.y), share); };
        if (k + 1 < micro) {
          auto guard = ddp.no_sync();
          loss().backward();
        } else {
          loss().backward();
        }
      }
      opt.step();
    }
    const auto ps = model->named_parameters();
    const auto rs = ref->parameters();
    for (size_t i = 0; i < ps.size(); ++i) {
      const auto m = lt::mismatch(ps[i].first, ps[i].second, rs[i], 5e-5);
      if (!m.empty()) return m;
    }
    const auto bs = model->named_buffers();
    const auto rb = ref->buffers();
    for (size_t i = 0; i < bs.size(); ++i) {
      const auto m = lt::mismatch(bs[i].first, bs[i].second, rb[i], 5e-5);
      if (!m.empty()) return m;
    }
    return "";
  }, "combo-syncbn", "shm");
  CHECK(lt::joined(problems) == "");
}

TEST_CASE("DDP combinations: under a GradScaler the fp16 hook's sum of gradients past f16's "
          "range skips the step on every rank and lowers the scale; bf16's does not",
          "[ddp][equivalence]") {
  const bool fp16 = GENERATE(false, true);
  INFO((fp16 ? "fp16" : "bf16"));
  const auto problems = lt::on_ranks(2, [&](int rank, auto group) -> std::string {
    // x * w summed: w's gradient is x, 1.5 averaged, 98304 at the default scale.
    auto model = std::make_shared<nn::Linear>(
        Tensor::from_vector(std::vector<float>{0.5f, 0.25f}, {1, 2}));
    nn::DistributedDataParallel ddp(model, group);
    ddp.register_comm_hook(fp16 ? nn::comm_hooks::fp16_compress()
                                : nn::comm_hooks::bf16_compress());
    optim::SGD opt(model->parameters(), optim::SGDOptions{.lr = 0.1});
    optim::GradScaler scaler(group);
    const double scale = scaler.get_scale();
    const Tensor x =
        Tensor::from_vector(std::vector<float>{rank == 0 ? 1.0f : 2.0f, 0.0f}, {1, 2});
    scaler.scale(lr::sum(ddp.forward(x))).backward();
    const bool stepped = scaler.step(opt);
    scaler.update();
    if (stepped == fp16) return fmt::format("stepped: {}", stepped);
    if (fp16 && !(scaler.get_scale() < scale)) return "the scale was not lowered";
    const float w0 = model->weight.to_vector<float>()[0];
    const double want = fp16 ? 0.5 : 0.5 - 0.1 * 1.5;  // 1.5 is exact in bf16
    if (std::abs(w0 - want) > 1e-6) return fmt::format("weight {}, expected {}", w0, want);
    return "";
  }, "combo-scaler", "shm");
  CHECK(lt::joined(problems) == "");
}
