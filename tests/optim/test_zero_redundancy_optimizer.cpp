// ZeroRedundancyOptimizer in one process: the partition function, then ranks
// as threads over gloo groups on a MemoryStore (collectives/rank_threads.h).
// Every rank computes the same loss on the same batch, so gradients are equal
// everywhere as DDP would leave them; each rank's ZeRO run is compared with a
// plain optimizer over a copy of the model. Sharding (whole parameters, or
// parameters cut into pieces) changes no element's arithmetic, so parameters
// and state must match bitwise; clipping combines per-shard partial norms in
// another order, so its norm agrees to 1e-12.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "collectives/rank_threads.h"
#include "lockstep/distributed/flight_recorder.h"
#include "lockstep/models/models.h"
#include "lockstep/nn/activation.h"
#include "lockstep/nn/container.h"
#include "lockstep/nn/linear.h"
#include "lockstep/optim/adam.h"
#include "lockstep/optim/clip_grad.h"
#include "lockstep/optim/lr_scheduler.h"
#include "lockstep/optim/partition.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/optim/zero_redundancy_optimizer.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/random.h"
#include "support/test_util.h"
#include "support/backend_skip.h"

namespace lc = lockstep::collectives;
namespace lt = lockstep::testing;
namespace nn = lockstep::nn;
using namespace lockstep::optim;
namespace models = lockstep::models;
using lockstep::runtime::DType;
using lockstep::runtime::Generator;
using Catch::Contains;

namespace {

using GroupPtr = std::shared_ptr<lc::ProcessGroup>;

// in -> width (x layers) -> 5.
std::shared_ptr<nn::Sequential> mlp(int64_t in, int64_t width, int layers, uint64_t seed = 3) {
  Generator g(seed);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(in, width, true, g));
  for (int i = 0; i < layers; ++i) {
    m->push_back(std::make_shared<nn::ReLU>());
    m->push_back(std::make_shared<nn::Linear>(width, width, true, g));
  }
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::Linear>(width, 5, true, g));
  return m;
}

OptimizerFactory sgd_factory() {
  return [](std::vector<ParamGroup> g) -> std::unique_ptr<Optimizer> {
    return std::make_unique<SGD>(std::move(g), SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
  };
}

OptimizerFactory adam_factory() {
  return [](std::vector<ParamGroup> g) -> std::unique_ptr<Optimizer> {
    return std::make_unique<Adam>(std::move(g), AdamOptions{.lr = 1e-2, .weight_decay = 1e-3});
  };
}

// Body and head (last Linear, twice the learning rate) as two groups.
std::vector<ParamGroup> two_groups(nn::Module& m) {
  auto params = m.parameters();
  std::vector<Tensor> head(params.end() - 2, params.end());
  params.resize(params.size() - 2);
  return {{params, {}}, {head, {{"lr", 0.02}}}};
}

// The same loss on every rank (step-dependent batch): equal gradients.
void backward_step(nn::Module& m, int step, int64_t in) {
  Generator g(100 + static_cast<uint64_t>(step));
  Tensor x = lockstep::runtime::randn({6, in}, DType::f32, g);
  std::vector<int64_t> y{0, 1, 2, 3, 4, static_cast<int64_t>(step % 5)};
  lockstep::runtime::cross_entropy(m.forward(x), Tensor::from_vector(y, {6})).backward();
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor ca = a.detach().contiguous(), cb = b.detach().contiguous();
  return std::memcmp(ca.raw_data(), cb.raw_data(), static_cast<size_t>(ca.numel()) * ca.element_size()) == 0;
}

// "" when both states hold the same entries, bitwise.
std::string state_mismatch(const OptimizerState& got, const OptimizerState& want) {
  if (got.param_groups.size() != want.param_groups.size()) return "group counts differ";
  for (size_t g = 0; g < want.param_groups.size(); ++g) {
    if (got.param_groups[g].params != want.param_groups[g].params) return fmt::format("group {} numbers", g);
    if (got.param_groups[g].options != want.param_groups[g].options) return fmt::format("group {} options", g);
  }
  if (got.state.size() != want.state.size()) {
    return fmt::format("{} parameters with state, expected {}", got.state.size(), want.state.size());
  }
  for (const auto& [index, entries] : want.state) {
    auto it = got.state.find(index);
    if (it == got.state.end()) return fmt::format("no state for parameter {}", index);
    for (const auto& [key, value] : entries) {
      auto kt = it->second.find(key);
      if (kt == it->second.end() || !same_bits(kt->second, value)) {
        return fmt::format("state {} of parameter {} differs", key, index);
      }
    }
  }
  return "";
}

// Runs fn(rank, group) on `size` rank threads; each returns its problem or "".
std::vector<std::string> on_ranks(int size, const std::function<std::string(int, GroupPtr)>& fn,
                                  const std::string& name) {
  const auto groups = lt::make_groups(lt::kThreadRankBackend, size, name, std::chrono::seconds(30));
  std::vector<std::string> problems(static_cast<size_t>(size));
  const auto errors = lt::run_ranks(size, [&](int r) {
    problems[static_cast<size_t>(r)] = fn(r, groups[static_cast<size_t>(r)]);
  });
  for (int r = 0; r < size; ++r) {
    if (errors[static_cast<size_t>(r)]) problems[static_cast<size_t>(r)] = lt::message_of(errors[static_cast<size_t>(r)]);
  }
  return problems;
}

// A parameter cut over ranks: some piece is not the whole of it.
bool any_cut(const Partition& p) {
  return std::any_of(p.owner.begin(), p.owner.end(), [](int o) { return o < 0; });
}

// A rank's gradients after clipping, compared with the reference's over the
// rank's pieces only (the rest is left unscaled); "" when they agree.
std::string compare_piece_grads(const ZeroRedundancyOptimizer& zero, const std::vector<Tensor>& zp,
                                const std::vector<Tensor>& rp) {
  for (const Piece& piece : zero.local_pieces()) {
    const auto a = lt::values(zp[static_cast<size_t>(piece.param)].grad());
    const auto b = lt::values(rp[static_cast<size_t>(piece.param)].grad());
    for (int64_t k = piece.begin; k < piece.end; ++k) {
      const auto i = static_cast<size_t>(k);
      if (std::abs(a[i] - b[i]) > 1e-7 * std::abs(b[i]) + 1e-12) {
        return fmt::format("grad {}[{}]: {} vs {}", piece.param, k, a[i], b[i]);
      }
    }
  }
  return "";
}

void require_no_problems(const std::vector<std::string>& problems) {
  for (size_t r = 0; r < problems.size(); ++r) {
    INFO("rank " << r << ": " << problems[r]);
    CHECK(problems[r].empty());
  }
}

}  // namespace

TEST_CASE("partition_parameters: largest first, to the least-loaded rank", "[zero][optim]") {
  // Order 50, 40, 30, 20, 10: 50->0, 40->1, 30->1 (40 < 50), 20->0 (50 < 70),
  // 10->0 (70 = 70: the lower rank).
  const Partition p = partition_parameters({10, 50, 30, 20, 40}, 2);
  CHECK(p.owner == std::vector<int>{0, 0, 1, 0, 1});
  CHECK(p.params_of == std::vector<std::vector<int64_t>>{{0, 1, 3}, {2, 4}});
  CHECK(p.load == std::vector<int64_t>{80, 70});
  // Equal sizes: index order, lower rank first.
  CHECK(partition_parameters({5, 5, 5, 5}, 2).owner == std::vector<int>{0, 1, 0, 1});
}

TEST_CASE("partition_parameters: deterministic and balanced on equal layers", "[zero][optim]") {
  Generator g(5);
  std::vector<int64_t> sizes;
  for (int i = 0; i < 40; ++i) sizes.push_back(static_cast<int64_t>(g.next_u32() % 1000));
  const int world = GENERATE(1, 2, 3, 4, 7);
  const Partition a = partition_parameters(sizes, world), b = partition_parameters(sizes, world);
  CHECK(a.owner == b.owner);
  CHECK(a.load == b.load);
  CHECK(std::accumulate(a.load.begin(), a.load.end(), int64_t{0}) ==
        std::accumulate(sizes.begin(), sizes.end(), int64_t{0}));
  // 16 layers of 4096 + 16 biases of 64 + a small head: within 10% of 1/N.
  std::vector<int64_t> layers;
  for (int i = 0; i < 16; ++i) {
    layers.push_back(4096);
    layers.push_back(64);
  }
  layers.push_back(640);
  layers.push_back(10);
  const Partition equal = partition_parameters(layers, world);
  INFO("world " << world << " imbalance " << equal.imbalance());
  CHECK(equal.imbalance() <= (world <= 4 ? 1.10 : 1.3));
}

TEST_CASE("partition_parameters: fewer parameters than ranks leaves ranks empty", "[zero][optim]") {
  const Partition p = partition_parameters({3, 7}, 4);
  CHECK(p.owner == std::vector<int>{1, 0});
  CHECK(p.params_of[2].empty());
  CHECK(p.params_of[3].empty());
  CHECK(p.load == std::vector<int64_t>{7, 3, 0, 0});
  CHECK_THAT(lt::error_of([] { partition_parameters({1}, 0); }), Contains("world size 0"));
  CHECK_THAT(lt::error_of([] { partition_parameters({1, -2}, 2); }), Contains("negative size"));
}

TEST_CASE("partition_parameters: pieces are the whole parameters", "[zero][optim]") {
  const Partition p = partition_parameters({40, 8, 20}, 2, {10, 2, 5});
  CHECK(p.pieces == std::vector<Piece>{{0, 0, 10, 0}, {1, 0, 2, 1}, {2, 0, 5, 1}});
  CHECK(partition_parameters({7}, 3).pieces == std::vector<Piece>{{0, 0, 7, 0}});
}

TEST_CASE("partition_elements: rank r owns [floor(rT/N), floor((r+1)T/N)) of each space", "[zero][optim]") {
  // One space, T = 90: rank 0 [0, 45), rank 1 [45, 90). Parameter 1 sits at
  // [10, 60) and is cut at 45.
  const Partition p = partition_elements({10, 50, 30}, {0, 0, 0}, 2);
  CHECK(p.pieces == std::vector<Piece>{{0, 0, 10, 0}, {1, 0, 35, 0}, {1, 35, 50, 1}, {2, 0, 30, 1}});
  CHECK(p.owner == std::vector<int>{0, -1, 1});
  CHECK(p.params_of == std::vector<std::vector<int64_t>>{{0, 1}, {1, 2}});
  CHECK(p.load == std::vector<int64_t>{45, 45});
  // Two spaces at N = 3. Space 0 (parameters 0 and 2, T = 8): starts 0, 2, 5.
  // Space 1 (parameter 1, T = 6): starts 0, 2, 4.
  const Partition q = partition_elements({4, 6, 4}, {0, 1, 0}, 3);
  CHECK(q.pieces == std::vector<Piece>{{0, 0, 2, 0}, {0, 2, 4, 1}, {1, 0, 2, 0}, {1, 2, 4, 1},
                                       {1, 4, 6, 2}, {2, 0, 1, 1}, {2, 1, 4, 2}});
  CHECK(q.load == std::vector<int64_t>{4, 5, 5});
  // More ranks than elements: T = 3 at N = 4 leaves rank 0 empty; a parameter
  // without elements is an empty piece on rank 0.
  const Partition r = partition_elements({2, 0, 1}, {0, 0, 0}, 4);
  CHECK(r.pieces == std::vector<Piece>{{0, 0, 1, 1}, {0, 1, 2, 2}, {1, 0, 0, 0}, {2, 0, 1, 3}});
  CHECK(r.owner == std::vector<int>{-1, 0, 3});
  CHECK(r.load == std::vector<int64_t>{0, 1, 1, 1});
  CHECK_THAT(lt::error_of([] { partition_elements({1}, {0}, 0); }), Contains("world size 0"));
  CHECK_THAT(lt::error_of([] { partition_elements({1, -2}, {0, 0}, 2); }), Contains("negative size"));
  CHECK_THAT(lt::error_of([] { partition_elements({1, 2}, {0}, 2); }), Contains("1 spaces for 2"));
}

TEST_CASE("partition_elements: every element once, floor or ceil of T/N per rank", "[zero][optim]") {
  Generator g(9);
  std::vector<int64_t> numels;
  std::vector<int> spaces;
  for (int i = 0; i < 30; ++i) {
    numels.push_back(static_cast<int64_t>(g.next_u32() % (i == 7 ? 100000 : 700)));
    spaces.push_back(static_cast<int>(g.next_u32() % 2));
  }
  const int world = GENERATE(1, 2, 3, 4, 7, 64);
  INFO("world " << world);
  const Partition p = partition_elements(numels, spaces, world);
  CHECK(p == partition_elements(numels, spaces, world));
  std::vector<int64_t> covered(numels.size(), 0), total(2, 0);
  std::vector<std::vector<int64_t>> held(static_cast<size_t>(world), std::vector<int64_t>(2, 0));
  for (size_t k = 0; k < p.pieces.size(); ++k) {
    const Piece& piece = p.pieces[k];
    const auto i = static_cast<size_t>(piece.param);
    CHECK(piece.begin == covered[i]);  // in order, no gaps, no overlaps
    covered[i] = piece.end;
    held[static_cast<size_t>(piece.owner)][static_cast<size_t>(spaces[i])] += piece.numel();
    if (k > 0 && p.pieces[k - 1].param == piece.param) CHECK(p.pieces[k - 1].owner < piece.owner);
  }
  CHECK(covered == numels);
  for (size_t i = 0; i < numels.size(); ++i) total[static_cast<size_t>(spaces[i])] += numels[i];
  for (int r = 0; r < world; ++r) {
    for (size_t s = 0; s < 2; ++s) {
      const int64_t h = held[static_cast<size_t>(r)][s];
      CHECK((h == total[s] / world || h == (total[s] + world - 1) / world));
    }
  }
}

TEST_CASE("ZeroRedundancyOptimizer trains bitwise like the plain optimizer", "[zero][optim]") {
  const int world = GENERATE(1, 2, 3);
  const bool adam = GENERATE(false, true);
  const auto sync = GENERATE(ZeroOptions::Sync::Broadcast, ZeroOptions::Sync::Allgather);
  const bool split = GENERATE(true, false);
  INFO("world " << world << (adam ? " adam" : " sgd") << (sync == ZeroOptions::Sync::Broadcast ? " broadcast" : " allgather")
                << (split ? " split" : " whole"));
  const auto problems = on_ranks(world, [&](int, GroupPtr group) -> std::string {
    const auto factory = adam ? adam_factory() : sgd_factory();
    // One dominant layer: the 32x32 weight is 71% of the elements, so at
    // N >= 2 splitting cuts it (and the pieces straddle both groups' edges).
    auto zm = mlp(6, 32, 1), pm = mlp(6, 32, 1);
    ZeroRedundancyOptimizer zero(two_groups(*zm), group, factory,
                                 {.sync = sync, .bucket_cap_mb = 600.0 / (1 << 20), .split_parameters = split});
    if (any_cut(zero.partition()) != (split && world > 1)) return "pieces cut (or not) unexpectedly";
    auto plain = factory(two_groups(*pm));
    for (int step = 0; step < 6; ++step) {
      if (step == 3) {  // a scheduler's edit, in one place
        for (auto* opt : {static_cast<Optimizer*>(&zero), plain.get()}) {
          for (auto& g : opt->param_groups()) g.options["lr"] *= 0.5;
        }
      }
      zero.zero_grad();
      plain->zero_grad();
      backward_step(*zm, step, 6);
      backward_step(*pm, step, 6);
      zero.step();
      plain->step();
    }
    const auto zp = zm->parameters(), pp = pm->parameters();
    for (size_t i = 0; i < zp.size(); ++i) {
      if (!same_bits(zp[i], pp[i])) return fmt::format("parameter {} differs", i);
    }
    if (zero.inner() && zero.inner()->param_groups()[0].options.at("lr") != zero.param_groups()[0].options.at("lr")) {
      return "the inner optimizer did not get the edited lr";
    }
    zero.consolidate_state_dict(0);
    if (group->rank() != 0) return "";
    return state_mismatch(zero.state_dict(), plain->state_dict());
  }, "zero-train");
  require_no_problems(problems);
}

TEST_CASE("ZeroRedundancyOptimizer: an LR scheduler drives the inner optimizers", "[zero][optim]") {
  const auto problems = on_ranks(2, [&](int, GroupPtr group) -> std::string {
    auto zm = mlp(6, 16, 2);
    ZeroRedundancyOptimizer zero(two_groups(*zm), group, sgd_factory());
    StepLR sched(zero, {.step_size = 1, .gamma = 0.5});
    for (int step = 0; step < 3; ++step) {
      zero.zero_grad();
      backward_step(*zm, step, 6);
      zero.step();
      sched.step();
    }
    zero.zero_grad();
    backward_step(*zm, 3, 6);
    zero.step();  // copies the scheduled rates in
    const double want[] = {0.1 / 8, 0.02 / 8};
    for (size_t g = 0; g < 2; ++g) {
      if (zero.param_groups()[g].options.at("lr") != want[g]) return fmt::format("group {} lr", g);
    }
    for (size_t i = 0; i < zero.inner()->param_groups().size(); ++i) {
      const double lr = zero.inner()->param_groups()[i].options.at("lr");
      if (lr != want[0] && lr != want[1]) return fmt::format("inner group {} has lr {}", i, lr);
    }
    return "";
  }, "zero-sched");
  require_no_problems(problems);
}

TEST_CASE("ZeroRedundancyOptimizer: ranks without parameters still step and sync", "[zero][optim]") {
  // Whole: Linear(3, 1)'s weight (12 bytes) to rank 0, its bias to rank 1,
  // nothing to ranks 2 and 3. Split: Linear(2, 1)'s 3 elements over 4 ranks
  // are [0, 0), [0, 1), [1, 2), [2, 3): rank 0 owns nothing, the others one
  // element each (a weight piece, a weight piece, the bias).
  const bool split = GENERATE(false, true);
  INFO((split ? "split" : "whole"));
  const auto problems = on_ranks(4, [&](int rank, GroupPtr group) -> std::string {
    const int64_t in = split ? 2 : 3;
    Generator g(1), h(1);
    auto zm = std::make_shared<nn::Linear>(in, 1, true, g), pm = std::make_shared<nn::Linear>(in, 1, true, h);
    ZeroRedundancyOptimizer zero(zm->parameters(), group, sgd_factory(), {.split_parameters = split});
    auto plain = sgd_factory()({{pm->parameters(), {}}});
    const bool empty = split ? rank == 0 : rank >= 2;
    if (empty != (zero.inner() == nullptr)) return fmt::format("rank {} should own {}", rank, empty ? "nothing" : "a piece");
    for (int step = 0; step < 3; ++step) {
      zero.zero_grad();
      plain->zero_grad();
      Tensor x = Tensor::full({2, in}, 0.5 + step);
      lockstep::runtime::mean(zm->forward(x)).backward();
      lockstep::runtime::mean(pm->forward(x)).backward();
      zero.clip_grad_norm(0.1);
      clip_grad_norm(pm->parameters(), 0.1);
      zero.step();
      plain->step();
    }
    const auto zp = zm->parameters(), pp = pm->parameters();
    for (size_t i = 0; i < zp.size(); ++i) {
      const auto a = lt::values(zp[i]), b = lt::values(pp[i]);
      for (size_t k = 0; k < a.size(); ++k) {
        if (std::abs(a[k] - b[k]) > 1e-6) return fmt::format("parameter {}[{}]: {} vs {}", i, k, a[k], b[k]);
      }
    }
    const int64_t want = split ? (rank == 0 ? 0 : 4) : (rank < 2 ? (rank == 0 ? 12 : 4) : 0);
    if (zero.local_state_bytes() != want) {
      return fmt::format("state bytes {}", zero.local_state_bytes());
    }
    return "";
  }, "zero-empty");
  require_no_problems(problems);
}

TEST_CASE("ZeroRedundancyOptimizer: state_dict round trip through consolidate and load", "[zero][optim]") {
  const bool split = GENERATE(true, false);
  INFO((split ? "split" : "whole"));
  const auto problems = on_ranks(3, [&](int rank, GroupPtr group) -> std::string {
    // Every rank trains a plain Adam the same way: its state_dict is the
    // "checkpoint" loaded into a fresh ZeRO over another copy of the model.
    auto pm = mlp(6, 16, 3), zm = mlp(6, 16, 3);
    auto plain = adam_factory()(two_groups(*pm));
    for (int step = 0; step < 3; ++step) {
      plain->zero_grad();
      backward_step(*pm, step, 6);
      plain->step();
    }
    {
      lockstep::runtime::NoGradGuard no_grad;
      const auto zp = zm->parameters(), pp = pm->parameters();
      for (size_t i = 0; i < zp.size(); ++i) Tensor(zp[i]).copy_(pp[i]);
    }
    ZeroRedundancyOptimizer zero(two_groups(*zm), group, adam_factory(), {.split_parameters = split});
    const std::string before = lt::error_of([&] { (void)zero.state_dict(); });
    if (before.find("has not been consolidated") == std::string::npos) return "before: " + before;
    OptimizerState saved = plain->state_dict();
    saved.param_groups[1].options["lr"] = 0.03;
    zero.load_state_dict(saved);
    if (zero.param_groups()[1].options.at("lr") != 0.03) return "the saved options were not taken";
    plain->param_groups()[1].options["lr"] = 0.03;
    // Training continues identically.
    for (int step = 3; step < 5; ++step) {
      zero.zero_grad();
      plain->zero_grad();
      backward_step(*zm, step, 6);
      backward_step(*pm, step, 6);
      zero.step();
      plain->step();
    }
    const auto zp = zm->parameters(), pp = pm->parameters();
    for (size_t i = 0; i < zp.size(); ++i) {
      if (!same_bits(zp[i], pp[i])) return fmt::format("parameter {} differs after loading", i);
    }
    zero.consolidate_state_dict(1);
    if (rank != 1) {
      const std::string elsewhere = lt::error_of([&] { (void)zero.state_dict(); });
      return elsewhere.find("consolidated on rank 1") == std::string::npos ? "elsewhere: " + elsewhere : "";
    }
    return state_mismatch(zero.state_dict(), plain->state_dict());
  }, "zero-state");
  require_no_problems(problems);
}

TEST_CASE("ZeroRedundancyOptimizer: a consolidated state resumes a plain optimizer bitwise", "[zero][optim]") {
  const int world = GENERATE(2, 3);
  const bool split = GENERATE(true, false);
  INFO("world " << world << (split ? " split" : " whole"));
  const auto problems = on_ranks(world, [&](int rank, GroupPtr group) -> std::string {
    // ZeRO (amsgrad: three elementwise state tensors and a step per piece)
    // trains 3 steps, rank 0 gets the full state and starts a plain Adam from
    // it over a copy of the model; both continue and must stay equal.
    const OptimizerFactory factory = [](std::vector<ParamGroup> g) -> std::unique_ptr<Optimizer> {
      return std::make_unique<Adam>(std::move(g), AdamOptions{.lr = 1e-2, .amsgrad = true});
    };
    auto zm = mlp(6, 32, 1), pm = mlp(6, 32, 1);
    ZeroRedundancyOptimizer zero(two_groups(*zm), group, factory, {.split_parameters = split});
    for (int step = 0; step < 3; ++step) {
      zero.zero_grad();
      backward_step(*zm, step, 6);
      zero.step();
    }
    zero.consolidate_state_dict(0);
    std::unique_ptr<Optimizer> plain;
    if (rank == 0) {
      lockstep::runtime::NoGradGuard no_grad;
      const auto zp = zm->parameters(), pp = pm->parameters();
      for (size_t i = 0; i < zp.size(); ++i) Tensor(pp[i]).copy_(zp[i]);
      plain = factory(two_groups(*pm));
      plain->load_state_dict(zero.state_dict());
      if (plain->state_dict().state.size() != zp.size()) return "the consolidated state misses parameters";
    }
    for (int step = 3; step < 5; ++step) {
      zero.zero_grad();
      backward_step(*zm, step, 6);
      zero.step();
      if (!plain) continue;
      plain->zero_grad();
      backward_step(*pm, step, 6);
      plain->step();
    }
    zero.consolidate_state_dict(0);
    if (rank != 0) return "";
    const auto zp = zm->parameters(), pp = pm->parameters();
    for (size_t i = 0; i < zp.size(); ++i) {
      if (!same_bits(zp[i], pp[i])) return fmt::format("parameter {} differs after resuming", i);
    }
    return state_mismatch(zero.state_dict(), plain->state_dict());
  }, "zero-resume-plain");
  require_no_problems(problems);
}

TEST_CASE("ZeroRedundancyOptimizer: clip_grad_norm equals clipping the full set", "[zero][optim]") {
  const double norm_type = GENERATE(2.0, 1.0, 3.0, std::numeric_limits<double>::infinity());
  const double max_norm = GENERATE(0.05, 1e6);
  const bool split = GENERATE(true, false);
  INFO("norm_type " << norm_type << " max_norm " << max_norm << (split ? " split" : " whole"));
  const auto problems = on_ranks(3, [&](int, GroupPtr group) -> std::string {
    auto zm = mlp(6, 16, 3), rm = mlp(6, 16, 3);
    ZeroRedundancyOptimizer zero(zm->parameters(), group, sgd_factory(), {.split_parameters = split});
    backward_step(*zm, 0, 6);
    backward_step(*rm, 0, 6);
    const double got = zero.clip_grad_norm(max_norm, norm_type);
    const double want = clip_grad_norm(rm->parameters(), max_norm, norm_type);
    if (std::abs(got - want) > 1e-12 * want) return fmt::format("norm {} vs {}", got, want);
    return compare_piece_grads(zero, zm->parameters(), rm->parameters());  // only the pieces are scaled
  }, "zero-clip");
  require_no_problems(problems);
}

namespace {

// Adam's state after one step, per rank and for the plain optimizer: f32
// "exp_avg" and "exp_avg_sq" (8 bytes per element) and a 0-dim f32 "step"
// (4 bytes) per piece. Whole parameters: the ranks' sum is the plain state.
// Split: each cut parameter's "step" is held once per piece, so the sum is
// the plain state plus 4 bytes per extra piece, and rank r holds exactly
// 8 * load[r] + 4 * (its pieces).
void check_state_bytes(const std::function<std::shared_ptr<nn::Module>()>& make_model, int64_t in,
                       int world, bool split) {
  std::vector<int64_t> bytes(static_cast<size_t>(world));
  int64_t plain_bytes = 0, extra_pieces = 0;
  const auto problems = on_ranks(world, [&](int rank, GroupPtr group) -> std::string {
    auto zm = make_model();
    ZeroRedundancyOptimizer zero(zm->parameters(), group, adam_factory(), {.split_parameters = split});
    backward_step(*zm, 0, in);
    zero.step();
    const auto all = zero.all_state_bytes();
    if (all[static_cast<size_t>(rank)] != zero.local_state_bytes()) return "all_state_bytes disagrees";
    bytes[static_cast<size_t>(rank)] = zero.local_state_bytes();
    const int64_t pieces = static_cast<int64_t>(zero.local_pieces().size());
    const int64_t elements = zero.partition().load[static_cast<size_t>(rank)];
    if (split && bytes[static_cast<size_t>(rank)] != 8 * elements + 4 * pieces) {
      return fmt::format("{} bytes for {} elements in {} pieces", bytes[static_cast<size_t>(rank)], elements, pieces);
    }
    if (rank == 0) {
      extra_pieces = static_cast<int64_t>(zero.partition().pieces.size() - zm->parameters().size());
      auto pm = make_model();
      auto plain = adam_factory()({{pm->parameters(), {}}});
      backward_step(*pm, 0, in);
      plain->step();
      for (const auto& [i, entries] : plain->state_dict().state)
        for (const auto& [k, v] : entries) plain_bytes += v.numel() * static_cast<int64_t>(v.element_size());
    }
    return "";
  }, "zero-bytes");
  require_no_problems(problems);
  CHECK(std::accumulate(bytes.begin(), bytes.end(), int64_t{0}) == plain_bytes + 4 * extra_pieces);
  for (int64_t b : bytes) {
    INFO("rank bytes " << b << " of " << plain_bytes);
    CHECK(static_cast<double>(b) <= 1.10 * static_cast<double>(plain_bytes) / world);
  }
}

}  // namespace

TEST_CASE("ZeroRedundancyOptimizer: state per rank is about 1/N on equal layers", "[zero][optim]") {
  const int world = GENERATE(2, 4);
  const bool split = GENERATE(true, false);
  INFO("world " << world << (split ? " split" : " whole"));
  check_state_bytes([] { return mlp(64, 64, 7); }, 64, world, split);
}

TEST_CASE("ZeroRedundancyOptimizer: split state per rank is about 1/N on the Fashion-MNIST MLP",
          "[zero][optim]") {
  // 784-1024-1024-10: the 1024x1024 weight is 56% of the elements, beyond
  // what whole-parameter sharding can balance at N = 2 or 4.
  const int world = GENERATE(2, 4);
  INFO("world " << world);
  check_state_bytes([] { return models::fashion_mlp(uint64_t{4}); }, 784, world, true);
}

TEST_CASE("ZeroRedundancyOptimizer: clear errors", "[zero][optim]") {
  SECTION("ranks passing different parameters fail on every rank") {
    const auto problems = on_ranks(2, [&](int rank, GroupPtr group) -> std::string {
      auto m = mlp(6, 16, rank == 1 ? 2 : 3);
      ZeroRedundancyOptimizer zero(m->parameters(), group, sgd_factory());
      return "constructed";
    }, "zero-mismatch");
    for (const auto& p : problems) CHECK_THAT(p, Contains("rank 1 passed 8 parameters") && Contains("rank 0 passed 10"));
  }
  SECTION("same counts, different shapes") {
    const auto problems = on_ranks(2, [&](int rank, GroupPtr group) -> std::string {
      auto m = mlp(6, rank == 1 ? 15 : 16, 1);
      // Same element count is not needed for this message: compare shapes only.
      ZeroRedundancyOptimizer zero(m->parameters(), group, sgd_factory());
      return "constructed";
    }, "zero-shapes");
    for (const auto& p : problems) CHECK_THAT(p, Contains("rank 1"));
  }
  SECTION("a bucket cap must be a finite positive number; a huge one is no cap") {
    for (double cap : {0.0, -1.0, std::numeric_limits<double>::infinity(), std::nan("")}) {
      const auto problems = on_ranks(2, [&](int, GroupPtr group) -> std::string {
        ZeroRedundancyOptimizer zero(mlp(6, 16, 2)->parameters(), group, sgd_factory(),
                                     {.bucket_cap_mb = cap});
        return "constructed";
      }, "zero-cap");
      for (const auto& p : problems) CHECK_THAT(p, Contains("must be a finite number > 0"));
    }
    // 1e13 MiB overflowed int64 on its way to bytes.
    const auto huge = on_ranks(2, [&](int, GroupPtr group) -> std::string {
      ZeroRedundancyOptimizer zero(mlp(6, 16, 2)->parameters(), group, sgd_factory(),
                                   {.bucket_cap_mb = 1e13});
      return "";
    }, "zero-huge-cap");
    require_no_problems(huge);
  }
  SECTION("a parameter to cut must be contiguous") {
    const auto problems = on_ranks(2, [&](int, GroupPtr group) -> std::string {
      Tensor w = Tensor::zeros({4, 3}).t(), b = Tensor::zeros({4});  // 16 elements: w is cut at 8
      ZeroRedundancyOptimizer zero(std::vector<Tensor>{w, b}, group, sgd_factory());
      return "constructed";
    }, "zero-noncontiguous");
    for (const auto& p : problems) CHECK_THAT(p, Contains("parameter 0 is not contiguous") && Contains("split_parameters = false"));
    const auto whole = on_ranks(2, [&](int, GroupPtr group) -> std::string {
      Tensor w = Tensor::zeros({4, 3}).t(), b = Tensor::zeros({4});
      ZeroRedundancyOptimizer zero(std::vector<Tensor>{w, b}, group, sgd_factory(), {.split_parameters = false});
      return "";
    }, "zero-noncontiguous-whole");
    require_no_problems(whole);
  }
  SECTION("a state only the owning rank's optimizer would refuse fails on every rank") {
    for (bool split : {false, true}) {
      for (int bad = 0; bad < 4; ++bad) {
        INFO("split " << split << ", case " << bad);
        const auto problems = on_ranks(2, [&](int, GroupPtr group) -> std::string {
          Tensor a = Tensor::ones({4}), b = Tensor::ones({4});
          a.requires_grad_();
          b.requires_grad_();
          ZeroRedundancyOptimizer zero(std::vector<Tensor>{a, b}, group, sgd_factory(),
                                       {.split_parameters = split});
          OptimizerState st;
          st.param_groups.push_back({{{"lr", 0.1}}, {0, 1}});
          if (bad == 0) st.state[0]["momentum_buffer"] = Tensor::scalar(1.0);
          if (bad == 1) st.state[1]["momentum_buffer"] = Tensor::zeros({4}, DType::i32);
          if (bad == 2) st.state[1]["step"] = Tensor::zeros({4});
          if (bad == 3) st.state[1]["exp_avg"] = Tensor::zeros({4});  // another optimizer's
          zero.load_state_dict(st);
          // Not reached: a rank that loaded would wait here for the other.
          a.set_grad(Tensor::ones({4}));
          b.set_grad(Tensor::ones({4}));
          zero.step();
          return "loaded";
        }, fmt::format("zero-bad-state-{}-{}", split, bad));
        const char* want =
            bad == 0   ? "state \"momentum_buffer\" of parameter 0 has shape [], the parameter "
                         "has shape [4]"
            : bad == 1 ? "state \"momentum_buffer\" of parameter 1 has dtype i32"
            : bad == 2 ? "state \"step\" of parameter 1 has shape [4]"
                       : "state \"exp_avg\" of parameter 1 is not SGD state";
        for (const auto& p : problems)
          CHECK_THAT(p, Contains("ZeroRedundancyOptimizer.load_state_dict") && Contains(want));
      }
    }
  }
  SECTION("a damaged Adam step count fails on every rank, before anything changes") {
    for (bool split : {false, true}) {
      INFO("split " << split);
      const auto problems = on_ranks(2, [&](int, GroupPtr group) -> std::string {
        Tensor a = Tensor::ones({4}), b = Tensor::ones({4});
        a.requires_grad_();
        b.requires_grad_();
        ZeroRedundancyOptimizer zero(std::vector<Tensor>{a, b}, group, adam_factory(),
                                     {.split_parameters = split});
        OptimizerState st;
        st.param_groups.push_back({{}, {0, 1}});
        st.state[1] = {{"step", Tensor::scalar(-1.0)},
                       {"exp_avg", Tensor::zeros({4})},
                       {"exp_avg_sq", Tensor::zeros({4})}};
        zero.load_state_dict(st);
        // Not reached: a rank that loaded would wait here for the other.
        a.set_grad(Tensor::ones({4}));
        b.set_grad(Tensor::ones({4}));
        zero.step();
        return "loaded";
      }, fmt::format("zero-bad-step-{}", split));
      for (const auto& p : problems)
        CHECK_THAT(p, Contains("ZeroRedundancyOptimizer.load_state_dict: state \"step\" of "
                               "parameter 1 is -1"));
    }
  }
  SECTION("local misuse") {
    const auto problems = on_ranks(1, [&](int, GroupPtr group) -> std::string {
      auto m = mlp(6, 16, 1);
      ZeroRedundancyOptimizer zero(two_groups(*m), group, sgd_factory());
      std::string out;
      auto expect = [&](const std::function<void()>& fn, const std::string& text) {
        const std::string e = lt::error_of(fn);
        if (e.find(text) == std::string::npos) out += "expected \"" + text + "\", got \"" + e + "\"; ";
      };
      expect([&] { zero.add_param_group({m->parameters(), {}}); }, "not supported");
      expect([&] { zero.add_param_group({m->parameters(), {}}); },
             "To unfreeze parameters later (a backbone after its head), give them a group of "
             "their own from the start");
      expect([&] { zero.consolidate_state_dict(3); }, "rank 3 is not in the group");
      OptimizerState one_group;
      one_group.param_groups.push_back({{}, {0}});
      expect([&] { zero.load_state_dict(one_group); }, "has 1 parameter group(s), this optimizer has 2");
      zero.param_groups()[0].options["lr"] = -1;
      expect([&] { zero.step(); }, "invalid learning rate -1");
      zero.param_groups()[0].options["lr"] = 0.1;
      zero.param_groups()[0].options["betas"] = 0.1;
      expect([&] { zero.step(); }, "unknown option \"betas\"");
      expect([] { ZeroRedundancyOptimizer z(std::vector<Tensor>{}, nullptr, sgd_factory()); }, "no process group");
      return out;
    }, "zero-misuse");
    require_no_problems(problems);
  }
}

TEST_CASE("ZeroRedundancyOptimizer: a scalar parameter's state takes its dtype on load",
          "[zero][optim]") {
  // An f64 state for an f32 learnable scalar: converted on the owning rank
  // (PyTorch's rule for every floating entry but "step"), so its step runs
  // and every rank ends with the same values.
  const auto problems = on_ranks(2, [&](int, GroupPtr group) -> std::string {
    Tensor a = Tensor::scalar(1.0), b = Tensor::ones({4});
    a.requires_grad_();
    b.requires_grad_();
    auto factory = [](std::vector<ParamGroup> g) -> std::unique_ptr<Optimizer> {
      return std::make_unique<SGD>(std::move(g), SGDOptions{.lr = 0.1, .momentum = 0.9});
    };
    ZeroRedundancyOptimizer zero(std::vector<Tensor>{a, b}, group, factory);
    OptimizerState st;
    st.param_groups.push_back({{{"lr", 0.1}}, {0, 1}});
    st.state[0]["momentum_buffer"] = Tensor::scalar(1.0, DType::f64);
    st.state[1]["momentum_buffer"] = Tensor::ones({4}, DType::f64);
    zero.load_state_dict(st);
    a.set_grad(Tensor::scalar(1.0));
    b.set_grad(Tensor::ones({4}));
    zero.step();
    // buf = 0.9 * 1 + 1 = 1.9, p = 1 - 0.1 * 1.9
    const float want = 1.0f - 0.1f * (0.9f * 1.0f + 1.0f);
    if (a.to_vector<float>() != std::vector<float>{want}) return fmt::format("a = {}", a.item());
    if (b.to_vector<float>() != std::vector<float>(4, want)) return "b differs";
    return "";
  }, "zero-scalar-state");
  require_no_problems(problems);
}

TEST_CASE("ZeroRedundancyOptimizer: a model converted with .to() after it was built is refused",
          "[zero][optim]") {
  // Whole parameters went through f32 sync buffers, so the ranks that did not
  // own one got it rounded to f32 and the ranks silently differed; cut ones
  // stepped their old f32 storage (or failed on the gradient's dtype).
  const bool split = GENERATE(false, true);
  INFO((split ? "split" : "whole"));
  const auto problems = on_ranks(2, [&](int, GroupPtr group) -> std::string {
    Generator g(3);
    auto lin = std::make_shared<nn::Linear>(4, 3, true, g);
    ZeroRedundancyOptimizer zero(lin->parameters(), group, sgd_factory(),
                                 {.split_parameters = split});
    lin->to(DType::f64);
    for (auto& p : lin->parameters()) p.set_grad(Tensor::ones(p.shape(), DType::f64));
    const std::string clip = lt::error_of([&] { zero.clip_grad_norm(1.0); });
    const std::string step = lt::error_of([&] { zero.step(); });
    for (const auto& e : {clip, step}) {
      if (e.find("parameter 0 is now f64 on cpu, but was f32 on cpu") == std::string::npos ||
          e.find("after model.to(...)") == std::string::npos)
        return e;
    }
    return "";
  }, "zero-moved");
  require_no_problems(problems);
}

TEST_CASE("ZeroRedundancyOptimizer: an empty parameter group is kept as by the plain optimizer",
          "[zero][optim]") {
  const bool split = GENERATE(true, false);
  INFO((split ? "split" : "whole"));
  // Body, an empty group (a model part absent in this configuration), head.
  auto three_groups = [](nn::Module& m) {
    auto groups = two_groups(m);
    groups.insert(groups.begin() + 1, ParamGroup{{}, {{"lr", 0.5}}});
    return groups;
  };
  const auto problems = on_ranks(2, [&](int rank, GroupPtr group) -> std::string {
    auto zm = mlp(6, 16, 1), pm = mlp(6, 16, 1), rm = mlp(6, 16, 1);
    ZeroRedundancyOptimizer zero(three_groups(*zm), group, adam_factory(),
                                 {.split_parameters = split});
    auto plain = adam_factory()(three_groups(*pm));
    if (zero.param_groups().size() != 3 || !zero.param_groups()[1].params.empty()) {
      return "the empty group was not kept";
    }
    for (int step = 0; step < 3; ++step) {
      if (step == 2) {
        zero.param_groups()[1].options["lr"] = 0.25;  // an edit to the empty group is checked too
        plain->param_groups()[1].options["lr"] = 0.25;
      }
      zero.zero_grad();
      plain->zero_grad();
      backward_step(*zm, step, 6);
      backward_step(*pm, step, 6);
      zero.step();
      plain->step();
    }
    const auto zp = zm->parameters(), pp = pm->parameters();
    for (size_t i = 0; i < zp.size(); ++i) {
      if (!same_bits(zp[i], pp[i])) return fmt::format("parameter {} differs", i);
    }
    zero.consolidate_state_dict(0);
    OptimizerState saved = plain->state_dict();
    if (rank == 0) {
      const std::string m = state_mismatch(zero.state_dict(), saved);
      if (!m.empty()) return "consolidated: " + m;
    }
    // The round trip: the saved state (three groups, the middle one empty)
    // into a fresh ZeRO, which then trains on exactly as the plain one.
    {
      lockstep::runtime::NoGradGuard no_grad;
      const auto rp = rm->parameters();
      for (size_t i = 0; i < rp.size(); ++i) Tensor(rp[i]).copy_(pp[i]);
    }
    ZeroRedundancyOptimizer resumed(three_groups(*rm), group, adam_factory(),
                                    {.split_parameters = split});
    resumed.load_state_dict(saved);
    if (resumed.param_groups()[1].options.at("lr") != 0.25) return "the empty group's lr was lost";
    resumed.zero_grad();
    plain->zero_grad();
    backward_step(*rm, 3, 6);
    backward_step(*pm, 3, 6);
    resumed.step();
    plain->step();
    const auto rp = rm->parameters();
    for (size_t i = 0; i < rp.size(); ++i) {
      if (!same_bits(rp[i], pp[i])) return fmt::format("parameter {} differs after loading", i);
    }
    return "";
  }, "zero-empty-group");
  require_no_problems(problems);

  const auto none = on_ranks(2, [&](int, GroupPtr group) -> std::string {
    ZeroRedundancyOptimizer zero(std::vector<ParamGroup>{{{}, {}}, {{}, {}}}, group,
                                 sgd_factory());
    return "constructed";
  }, "zero-no-params");
  for (const auto& p : none) CHECK_THAT(p, Contains("got no parameters"));
}

TEST_CASE("ZeroRedundancyOptimizer: frozen parameters without gradients are not sent",
          "[zero][optim]") {
  const int world = GENERATE(2, 3);
  const auto sync = GENERATE(ZeroOptions::Sync::Broadcast, ZeroOptions::Sync::Allgather);
  const bool split = GENERATE(true, false);
  const bool broadcast = sync == ZeroOptions::Sync::Broadcast;
  INFO("world " << world << (broadcast ? " broadcast" : " allgather")
                << (split ? " split" : " whole"));
  // f32 elements this process's rank 0 sent or gathered in the group, per step.
  const std::string name = fmt::format("zero-frozen-{}-{}-{}", world, broadcast, split);
  std::vector<int64_t> sent(6, 0);
  const auto problems = on_ranks(world, [&](int rank, GroupPtr group) -> std::string {
    // A fine-tuning run: the first Linear (its 96 + 16 of 469 elements) frozen.
    auto zm = mlp(6, 16, 1), pm = mlp(6, 16, 1);
    auto freeze = [&](bool frozen) {
      for (auto* m : {zm.get(), pm.get()}) {
        for (size_t i : {0, 1}) Tensor(m->parameters()[i]).requires_grad_(!frozen);
      }
    };
    freeze(true);
    ZeroRedundancyOptimizer zero(two_groups(*zm), group, adam_factory(),
                                 {.sync = sync, .bucket_cap_mb = 600.0 / (1 << 20),
                                  .split_parameters = split});
    auto plain = adam_factory()(two_groups(*pm));
    auto& recorder = lockstep::distributed::FlightRecorder::instance();
    for (int step = 0; step < 6; ++step) {
      if (step == 2 || step == 4) freeze(step == 4);  // unfrozen at 2, frozen again at 4
      if (step != 4) {  // step 4 keeps step 3's gradients: frozen with a gradient, so stepped
        zero.zero_grad();
        plain->zero_grad();
        backward_step(*zm, step, 6);
        backward_step(*pm, step, 6);
      }
      const uint64_t before = recorder.snapshot().back().ordinal;
      zero.step();
      plain->step();
      if (rank == 0) {
        for (const auto& r : recorder.snapshot()) {
          if (r.ordinal > before && r.group == name && r.group_rank == 0 && r.dtype == "f32") {
            // An all-gather's count is one rank's slot.
            sent[static_cast<size_t>(step)] += r.count * (r.op == "allgather" ? world : 1);
          }
        }
      }
      const auto zp = zm->parameters(), pp = pm->parameters();
      for (size_t i = 0; i < zp.size(); ++i) {
        if (!same_bits(zp[i], pp[i])) return fmt::format("step {}: parameter {} differs", step, i);
      }
    }
    return "";
  }, name);
  require_no_problems(problems);
  // Broadcast sends each element once: frozen (steps 0, 1, 5), what trains;
  // unfrozen (2, 3) and frozen with a gradient (4), all. An all-gather's slots
  // are padded to the largest rank's share of the whole model, frozen part
  // included, so frozen steps gather at most what the unfrozen ones do.
  const int64_t all = 469, trained = 469 - 96 - 16;
  for (int step = 0; step < 6; ++step) {
    INFO("step " << step);
    const bool frozen = step < 2 || step == 5;
    if (broadcast) CHECK(sent[static_cast<size_t>(step)] == (frozen ? trained : all));
    if (!broadcast) CHECK(sent[static_cast<size_t>(step)] >= (frozen ? trained : all));
    CHECK(sent[static_cast<size_t>(step)] <= sent[2]);
  }
}
