// Uneven inputs under nn::Join, shared by the in-process tests
// (test_join.cpp) and the worker that runs them as real processes
// (tests/workers/join_worker.cpp): three ranks whose shards hold 2, 4 and 7
// batches of one pool train a small model with DDP (SyncBatchNorm, or
// BatchNorm with per-rank statistics) and SGD or ZeRO; the reference is one
// process that steps, at each iteration, on the batches of the ranks still
// active.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/nn/join.h"
#include "lockstep/nn/normalization.h"
#include "lockstep/nn/sync_batch_norm.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/optim/zero_redundancy_optimizer.h"
#include "lockstep/runtime/data/loader.h"
#include "nn/ddp/ddp_fixture.h"

namespace lockstep::testing::join {

namespace nn = lockstep::nn;
namespace optim = lockstep::optim;
namespace rt = lockstep::runtime;
using collectives::ProcessGroup;
using rt::Tensor;

constexpr int kWorld = 3;
constexpr int64_t kBatch = 4, kIn = 6, kClasses = 3;
inline const std::vector<int64_t> kShardBatches = {2, 4, 7};  // per rank
constexpr int64_t kSteps = 7;                          // the longest shard

// The samples of every rank: rank r's shard is batches [first(r), first(r) +
// kShardBatches[r]) of one pool of 13 batches.
inline const rt::TensorDataset& pool() {
  static const rt::TensorDataset data = [] {
    const Batch b = global_batch(13 * kBatch, 11, kIn);
    std::vector<int64_t> y = b.y.to_vector<int64_t>();
    for (auto& v : y) v %= kClasses;
    return rt::TensorDataset(b.x, Tensor::from_vector(y, {static_cast<int64_t>(y.size())}));
  }();
  return data;
}

inline int64_t first_batch(int rank) {
  int64_t first = 0;
  for (int r = 0; r < rank; ++r) first += kShardBatches[static_cast<size_t>(r)];
  return first;
}

inline rt::TensorDataset shard_of(int rank) {
  std::vector<int64_t> rows;
  const int64_t lo = first_batch(rank) * kBatch;
  for (int64_t i = 0; i < kShardBatches[static_cast<size_t>(rank)] * kBatch; ++i)
    rows.push_back(lo + i);
  const rt::Batch b = pool().get_batch(rows);
  return rt::TensorDataset(b.x, b.y);
}

inline std::shared_ptr<nn::Sequential> make_model(std::shared_ptr<nn::Module> norm) {
  rt::Generator g(5);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(kIn, 8, true, g));
  m->push_back(std::move(norm));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::Linear>(8, kClasses, true, g));
  return m;
}

struct Config {
  bool sync_bn = true;  // SyncBatchNorm; else BatchNorm1d, per-rank statistics
  bool zero = false;    // ZeroRedundancyOptimizer over SGD; else SGD
  bool divide_by_initial_world_size = false;
  std::optional<nn::CommHook> hook;
};

inline std::unique_ptr<optim::Optimizer> make_sgd(std::vector<Tensor> params) {
  return std::make_unique<optim::SGD>(std::move(params),
                                      optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
}

struct RankResult {
  std::vector<Tensor> params, buffers;
  std::vector<int> active;     // active_ranks() per iteration
  std::vector<bool> joined;    // joined() per iteration
  std::vector<double> losses;  // per iteration
};

inline RankResult train_rank(int rank, const std::shared_ptr<ProcessGroup>& group, const Config& c) {
  std::shared_ptr<nn::Module> norm;
  if (c.sync_bn) {
    norm = std::make_shared<nn::SyncBatchNorm>(8, group);
  } else {
    norm = std::make_shared<nn::BatchNorm1d>(8);
  }
  auto model = make_model(norm);
  auto ddp = std::make_shared<nn::DistributedDataParallel>(
      model, group, nn::DdpOptions{.divide_by_initial_world_size = c.divide_by_initial_world_size});
  if (c.hook) ddp->register_comm_hook(*c.hook);
  std::unique_ptr<optim::Optimizer> opt;
  if (c.zero) {
    opt = std::make_unique<optim::ZeroRedundancyOptimizer>(
        model->parameters(), group,
        [](std::vector<optim::ParamGroup> shard) {
          return std::make_unique<optim::SGD>(std::move(shard),
                                              optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
        });
  } else {
    opt = make_sgd(model->parameters());
  }
  const rt::TensorDataset data = shard_of(rank);
  rt::DataLoader loader(data, {.batch_size = kBatch});
  RankResult out;
  nn::Join join(*group);
  for (const rt::Batch& b : join.batches(loader)) {
    opt->zero_grad();
    Tensor loss = rt::cross_entropy(ddp->forward(b.x), b.y);
    loss.backward();
    opt->step();
    out.active.push_back(join.active_ranks());
    out.joined.push_back(join.joined());
    out.losses.push_back(loss.item());
  }
  if (join.active_ranks() != kWorld) throw lockstep::Error("active_ranks() after the loop");
  for (const Tensor& p : model->parameters()) out.params.push_back(p.detach().clone());
  for (const Tensor& b : model->buffers()) out.buffers.push_back(b.detach().clone());
  return out;
}

// One process: at iteration t, the ranks with more than t batches are active;
// SyncBatchNorm's run is BatchNorm over their concatenated batches, the
// per-rank BatchNorm's the sum of their separate losses, each divided as
// DDP divides (by the active ranks, or by the world size).
inline RankResult train_reference(const Config& c) {
  auto model = make_model(std::make_shared<nn::BatchNorm1d>(8));
  auto opt = make_sgd(model->parameters());
  for (int64_t t = 0; t < kSteps; ++t) {
    std::vector<int> active;
    for (int r = 0; r < kWorld; ++r)
      if (kShardBatches[static_cast<size_t>(r)] > t) active.push_back(r);
    const double a = static_cast<double>(active.size());
    const double divisor = c.divide_by_initial_world_size ? kWorld : a;
    auto rows_of = [&](int r) {
      std::vector<int64_t> rows;
      for (int64_t i = 0; i < kBatch; ++i) rows.push_back((first_batch(r) + t) * kBatch + i);
      return rows;
    };
    opt->zero_grad();
    Tensor loss;
    if (c.sync_bn) {
      std::vector<int64_t> rows;
      for (int r : active) {
        const auto mine = rows_of(r);
        rows.insert(rows.end(), mine.begin(), mine.end());
      }
      const rt::Batch b = pool().get_batch(rows);
      // The mean over a*B samples is (1/a) * the sum of the ranks' means.
      loss = rt::mul(rt::cross_entropy(model->forward(b.x), b.y), a / divisor);
    } else {
      for (int r : active) {
        const rt::Batch b = pool().get_batch(rows_of(r));
        Tensor l = rt::mul(rt::cross_entropy(model->forward(b.x), b.y), 1.0 / divisor);
        loss = loss.defined() ? rt::add(loss, l) : l;
      }
    }
    loss.backward();
    opt->step();
  }
  RankResult out;
  for (const Tensor& p : model->parameters()) out.params.push_back(p.detach().clone());
  for (const Tensor& b : model->buffers()) out.buffers.push_back(b.detach().clone());
  return out;
}

// f32 rounding: the ranks sum their gradients in another order than one
// process does, over 7 steps of SGD with momentum (they agree to about 1e-7
// relative; 1e-6 passes, 1e-7 does not).
constexpr double kTol = 1e-5;

// What differs between `mine` and the reference beyond `tol` (and, with
// `buffers`, in the buffers too), one line each; empty when nothing does.
inline std::string mismatches(const RankResult& mine, const RankResult& ref, double tol,
                              bool buffers) {
  std::string out;
  for (size_t i = 0; i < ref.params.size(); ++i) {
    const std::string m = mismatch(fmt::format("parameter {}", i), mine.params[i], ref.params[i], tol);
    if (!m.empty()) out += m + "\n";
  }
  for (size_t i = 0; buffers && i < ref.buffers.size(); ++i) {
    const std::string m = mismatch(fmt::format("buffer {}", i), mine.buffers[i], ref.buffers[i], tol);
    if (!m.empty()) out += m + "\n";
  }
  return out;
}

}  // namespace lockstep::testing::join
