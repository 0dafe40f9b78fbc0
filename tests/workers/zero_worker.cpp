// Started by lockstep-run (tests/optim/test_multiprocess_zero.cpp): trains one
// small MLP twice on the same data, DDP + ZeroRedundancyOptimizer and DDP +
// the plain optimizer, and compares. Prints, per rank, one line
//
//   zero_worker rank R/N: OK optimizer=adam sync=broadcast model=layers split=1 clip=0 max_abs_diff=0
//     replicas_identical=1 state_match=1 state_bytes=B total_state_bytes=T
//     max_share_over_ideal=1.02 digest_zero=H digest_plain=H
//
// (on one line), or "zero_worker rank R/N: <error>" and exit 1.
//
//   max_abs_diff          largest |ZeRO - plain| over all parameters after training
//   replicas_identical    ZeRO's parameters bitwise equal on every rank
//   state_match           the consolidated state (rank 0) bitwise equal to the
//                         plain optimizer's state_dict() (other ranks print 1)
//   max_share_over_ideal  the largest rank's state bytes over total / N
//
// Models: "layers" has many equal layers (8 of 64x64), which even whole-
// parameter sharding balances; "dominant" has one 128x128 layer holding 86%
// of the elements, which only split parameters balance. Two parameter groups
// (the head at half the learning rate), and the learning rate of both halved
// at mid-training through param_groups(), as a scheduler would.
//
// Flags: --optimizer sgd|adam|adamw  --sync broadcast|allgather  --steps K
//        --clip MAX_NORM (0: none)   --backend NAME  --model layers|dominant
//        --split 1|0 (ZeroOptions::split_parameters)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lockstep/collectives/init.h"
#include "lockstep/nn/activation.h"
#include "lockstep/nn/container.h"
#include "lockstep/nn/ddp/distributed_data_parallel.h"
#include "lockstep/nn/linear.h"
#include "lockstep/optim/adam.h"
#include "lockstep/optim/clip_grad.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/optim/zero_redundancy_optimizer.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/random.h"

namespace lc = lockstep::collectives;
namespace nn = lockstep::nn;
namespace lo = lockstep::optim;
namespace lr = lockstep::runtime;
using lr::Tensor;

namespace {

constexpr int64_t kIn = 8, kWidth = 64, kHidden = 8, kClasses = 10;

struct Flags {
  std::string backend, optimizer = "sgd", sync = "broadcast", model = "layers";
  int steps = 10;
  double clip = 0.0;
  bool split = true;
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i], value = argv[i + 1];
    if (arg == "--backend") f.backend = value;
    else if (arg == "--optimizer") f.optimizer = value;
    else if (arg == "--sync") f.sync = value;
    else if (arg == "--steps") f.steps = std::stoi(value);
    else if (arg == "--clip") f.clip = std::stod(value);
    else if (arg == "--model") f.model = value;
    else if (arg == "--split") f.split = value != "0";
    else throw lockstep::Error(fmt::format("zero_worker: unknown flag {}", arg));
  }
  return f;
}

std::shared_ptr<nn::Sequential> make_model(const std::string& name, uint64_t seed) {
  if (name != "layers" && name != "dominant") throw lockstep::Error(fmt::format("zero_worker: unknown model {}", name));
  const bool dominant = name == "dominant";
  const int64_t width = dominant ? 2 * kWidth : kWidth, hidden = dominant ? 1 : kHidden;
  lr::Generator g(seed);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(kIn, width, true, g));
  for (int64_t i = 0; i < hidden; ++i) {
    m->push_back(std::make_shared<nn::ReLU>());
    m->push_back(std::make_shared<nn::Linear>(width, width, true, g));
  }
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::Linear>(width, kClasses, true, g));
  return m;
}

// Body at the base learning rate, the head (last Linear) at half of it.
std::vector<lo::ParamGroup> groups_of(nn::Module& m, double lr) {
  auto params = m.parameters();
  std::vector<Tensor> head(params.end() - 2, params.end());
  params.resize(params.size() - 2);
  return {{params, {}}, {head, {{"lr", lr / 2}}}};
}

lo::OptimizerFactory factory_of(const std::string& name) {
  if (name == "sgd") {
    return [](std::vector<lo::ParamGroup> g) -> std::unique_ptr<lo::Optimizer> {
      return std::make_unique<lo::SGD>(std::move(g), lo::SGDOptions{.lr = 0.05, .momentum = 0.9,
                                                                    .weight_decay = 1e-4,
                                                                    .nesterov = true});
    };
  }
  if (name == "adam" || name == "adamw") {
    return [name](std::vector<lo::ParamGroup> g) -> std::unique_ptr<lo::Optimizer> {
      if (name == "adam") return std::make_unique<lo::Adam>(std::move(g), lo::AdamOptions{.lr = 1e-2});
      lo::AdamWOptions o;
      o.lr = 1e-2;
      return std::make_unique<lo::AdamW>(std::move(g), o);
    };
  }
  throw lockstep::Error(fmt::format("zero_worker: unknown optimizer {}", name));
}

struct Batch {
  Tensor x, y;
};

Batch local_batch(int step, int rank, int n) {
  const int64_t rows = 4 * n;
  lr::Generator g(1000 + static_cast<uint64_t>(step));
  Tensor x = lr::randn({rows, kIn}, lr::DType::f32, g);
  std::vector<int64_t> y(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) y[static_cast<size_t>(i)] = (i * 7 + step) % kClasses;
  Tensor ys = Tensor::from_vector(y, {rows});
  return {x.slice(0, 4 * rank, 4 * rank + 4).contiguous(), ys.slice(0, 4 * rank, 4 * rank + 4).contiguous()};
}

uint64_t digest(const std::vector<Tensor>& tensors) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& t : tensors) {
    const Tensor c = t.detach().contiguous();
    const auto* b = static_cast<const unsigned char*>(c.raw_data());
    for (size_t i = 0; i < static_cast<size_t>(c.numel()) * c.element_size(); ++i) {
      h ^= b[i];
      h *= 1099511628211ull;
    }
  }
  return h;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor ca = a.detach().contiguous(), cb = b.detach().contiguous();
  return std::memcmp(ca.raw_data(), cb.raw_data(), static_cast<size_t>(ca.numel()) * ca.element_size()) == 0;
}

// Trains `model` with `opt` for flags.steps steps; `zero` clips through it.
void train(const std::shared_ptr<nn::Sequential>& model, lo::Optimizer& opt,
           lo::ZeroRedundancyOptimizer* zero, const std::shared_ptr<lc::ProcessGroup>& group,
           const Flags& f) {
  nn::DistributedDataParallel ddp(model, group);
  for (int step = 0; step < f.steps; ++step) {
    if (step == f.steps / 2) {
      for (auto& g : opt.param_groups()) g.options["lr"] *= 0.5;
    }
    const Batch b = local_batch(step, group->rank(), group->size());
    opt.zero_grad();
    lr::cross_entropy(ddp.forward(b.x), b.y).backward();
    if (f.clip > 0) {
      if (zero) zero->clip_grad_norm(f.clip);
      else lo::clip_grad_norm(model->parameters(), f.clip);
    }
    opt.step();
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string who = "zero_worker";
  try {
    const Flags f = parse(argc, argv);
    lc::InitOptions init;
    init.backend = f.backend;
    auto group = lc::init_process_group(init);
    const int rank = group->rank(), n = group->size();
    who = fmt::format("zero_worker rank {}/{}", rank, n);
    const double base_lr = f.optimizer == "sgd" ? 0.05 : 1e-2;
    auto factory = factory_of(f.optimizer);

    auto zero_model = make_model(f.model, 7);
    lo::ZeroOptions zo;
    zo.sync = f.sync == "allgather" ? lo::ZeroOptions::Sync::Allgather : lo::ZeroOptions::Sync::Broadcast;
    zo.bucket_cap_mb = 0.01;  // several buckets and direct pieces even on this small model
    zo.split_parameters = f.split;
    lo::ZeroRedundancyOptimizer zero(groups_of(*zero_model, base_lr), group, factory, zo);
    train(zero_model, zero, &zero, group, f);

    auto plain_model = make_model(f.model, 7);
    auto plain = factory(groups_of(*plain_model, base_lr));
    train(plain_model, *plain, nullptr, group, f);

    const auto zp = zero_model->parameters(), pp = plain_model->parameters();
    double max_diff = 0;
    for (size_t i = 0; i < zp.size(); ++i) {
      const auto a = zp[i].to_vector<double>(), b = pp[i].to_vector<double>();
      for (size_t k = 0; k < a.size(); ++k) max_diff = std::max(max_diff, std::abs(a[k] - b[k]));
    }

    bool replicas_identical = true;
    for (const auto& p : zp) {
      Tensor root = p.detach().contiguous().clone();
      group->broadcast(root, {.root = 0})->wait();
      replicas_identical = replicas_identical && same_bits(root, p);
    }

    zero.consolidate_state_dict(0);
    bool state_match = true;
    if (rank == 0) {
      const lo::OptimizerState got = zero.state_dict(), want = plain->state_dict();
      state_match = got.state.size() == want.state.size() &&
                    got.param_groups.size() == want.param_groups.size();
      for (const auto& [index, entries] : want.state) {
        auto it = got.state.find(index);
        if (it == got.state.end() || it->second.size() != entries.size()) {
          state_match = false;
          continue;
        }
        for (const auto& [key, value] : entries) {
          auto kt = it->second.find(key);
          state_match = state_match && kt != it->second.end() &&
                        (f.clip > 0 ? kt->second.shape() == value.shape() : same_bits(kt->second, value));
        }
      }
      for (size_t g = 0; state_match && g < want.param_groups.size(); ++g) {
        state_match = got.param_groups[g].options == want.param_groups[g].options &&
                      got.param_groups[g].params == want.param_groups[g].params;
      }
    }

    const auto bytes = zero.all_state_bytes();
    int64_t total = 0, most = 0;
    for (int64_t b : bytes) {
      total += b;
      most = std::max(most, b);
    }
    const double share = total > 0 ? static_cast<double>(most) * n / static_cast<double>(total) : 0.0;
    group->barrier()->wait();
    std::printf("%s: OK optimizer=%s sync=%s model=%s split=%d clip=%g max_abs_diff=%.9g replicas_identical=%d "
                "state_match=%d state_bytes=%lld total_state_bytes=%lld max_share_over_ideal=%.4f "
                "digest_zero=%016llx digest_plain=%016llx\n",
                who.c_str(), f.optimizer.c_str(), f.sync.c_str(), f.model.c_str(), f.split ? 1 : 0, f.clip, max_diff,
                replicas_identical ? 1 : 0, state_match ? 1 : 0,
                static_cast<long long>(zero.local_state_bytes()), static_cast<long long>(total), share,
                static_cast<unsigned long long>(digest(zp)), static_cast<unsigned long long>(digest(pp)));
    std::fflush(stdout);
    return 0;
  } catch (const std::exception& e) {
    std::printf("%s: %s\n", who.c_str(), e.what());
    std::fflush(stdout);
    return 1;
  }
}
