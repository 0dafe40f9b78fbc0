// Small models, batches and a multi-rank runner for DDP's in-process tests:
// one thread per rank over gloo (or shm) groups (tests/collectives/rank_threads.h).
#pragma once

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "collectives/rank_threads.h"
#include "lockstep/nn/activation.h"
#include "lockstep/nn/container.h"
#include "lockstep/nn/ddp/distributed_data_parallel.h"
#include "lockstep/nn/linear.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/random.h"
#include "support/backend_skip.h"

namespace lockstep::testing {

using nn::DistributedDataParallel;
using runtime::Generator;
using runtime::Tensor;

inline std::shared_ptr<nn::Sequential> small_mlp(uint64_t seed, int64_t in = 12, int64_t hidden = 16) {
  Generator g(seed);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(in, hidden, true, g));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::Linear>(hidden, hidden, true, g));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::Linear>(hidden, 5, true, g));
  return m;
}

struct Batch {
  Tensor x, y;
};

// The global batch; rank r of n takes rows [r*rows/n, (r+1)*rows/n).
inline Batch global_batch(int64_t rows, uint64_t seed, int64_t in = 12) {
  Generator g(seed);
  Tensor x = runtime::randn({rows, in}, runtime::DType::f32, g);
  std::vector<int64_t> y(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) y[static_cast<size_t>(i)] = (i * 7 + static_cast<int64_t>(seed)) % 5;
  return {x, Tensor::from_vector(y, {rows})};
}

inline Batch shard(const Batch& b, int rank, int n) {
  const int64_t rows = b.x.size(0);
  const int64_t lo = rows * rank / n, hi = rows * (rank + 1) / n;
  return {b.x.slice(0, lo, hi).contiguous(), b.y.slice(0, lo, hi).contiguous()};
}

inline Tensor loss_of(nn::Module& m, const Batch& b) {
  return runtime::cross_entropy(m.forward(b.x), b.y);
}

// "" when every element of a is within tol * max(1, |b|) of b, else where not.
inline std::string mismatch(const std::string& what, const Tensor& a, const Tensor& b, double tol) {
  if (!a.defined() || !b.defined()) {
    return a.defined() == b.defined() ? "" : what + ": one side is undefined";
  }
  if (a.shape() != b.shape()) return what + ": shapes differ";
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::abs(va[i] - vb[i]) > tol * std::max(1.0, std::abs(vb[i]))) {
      return fmt::format("{}[{}]: {} vs {}", what, i, va[i], vb[i]);
    }
  }
  return "";
}

// "" when each parameter's .grad of `m`, in named_parameters() order, matches
// expected[i] as mismatch() says, else the first that does not.
inline std::string grads_mismatch(nn::Module& m, const std::vector<Tensor>& expected, double tol) {
  const auto params = m.named_parameters();
  if (params.size() != expected.size())
    return fmt::format("{} parameters, {} expected gradients", params.size(), expected.size());
  for (size_t i = 0; i < params.size(); ++i) {
    auto problem = mismatch(params[i].first, params[i].second.grad(), expected[i], tol);
    if (!problem.empty()) return problem;
  }
  return "";
}

// Runs fn(rank, group) on `size` rank threads over `backend`; returns each
// rank's problems (fn returns "" when fine; an exception's message counts as
// a problem).
inline std::vector<std::string> on_ranks(
    int size, const std::function<std::string(int, std::shared_ptr<collectives::ProcessGroup>)>& fn,
    const std::string& name = "ddp", const std::string& backend = kThreadRankBackend) {
  const auto groups = make_groups(backend, size, name, std::chrono::seconds(30));
  std::vector<std::string> problems(static_cast<size_t>(size));
  const auto errors = run_ranks(size, [&](int r) {
    problems[static_cast<size_t>(r)] = fn(r, groups[static_cast<size_t>(r)]);
  });
  for (int r = 0; r < size; ++r) {
    if (errors[static_cast<size_t>(r)]) problems[static_cast<size_t>(r)] = message_of(errors[static_cast<size_t>(r)]);
  }
  return problems;
}

// on_ranks' problems as one text, a line per rank that had any ("" when none).
inline std::string joined(const std::vector<std::string>& problems) {
  std::string out;
  for (size_t r = 0; r < problems.size(); ++r) {
    if (!problems[r].empty()) out += fmt::format("rank {}: {}\n", r, problems[r]);
  }
  return out;
}

}  // namespace lockstep::testing
