// nn::Join with the model-level features a joined rank must keep answering
// for: DataParallel inside DDP, activation checkpointing, the GPT through
// forward_values, find_unused_parameters and static_graph, comm hooks and
// no_sync accumulation; at 2 and 3 rank threads with 0, 1 and several
// batches of difference. Every rank must end bitwise equal, and equal to one
// process that steps on the batches the active ranks held since its last step.
#include <catch2/catch.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/models/gpt.h"
#include "lockstep/models/models.h"
#include "lockstep/nn/checkpoint.h"
#include "lockstep/nn/data_parallel.h"
#include "lockstep/nn/join.h"
#include "lockstep/nn/normalization.h"
#include "lockstep/nn/sync_batch_norm.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/data/loader.h"
#include "nn/ddp/ddp_fixture.h"
#include "support/test_util.h"
#include "support/tokens.h"

namespace lt = lockstep::testing;
namespace nn = lockstep::nn;
namespace rt = lockstep::runtime;
namespace optim = lockstep::optim;
using lockstep::collectives::ProcessGroup;
using rt::Tensor;

namespace {

constexpr int64_t kRows = 2;  // per batch

struct Task {
  // SyncBatchNorm over `group`; BatchNorm where it is null (the reference).
  std::function<std::shared_ptr<nn::Module>(std::shared_ptr<ProcessGroup>)> make;
  // The mean loss of `m` on the batch (x, y).
  std::function<Tensor(nn::Module&, const Tensor&, const Tensor&)> loss;
  // The pool of samples, batch b being rows [b * kRows, (b + 1) * kRows).
  std::function<rt::Batch(int64_t batches)> pool;
};

Task mlp_task() {
  return {[](auto) { return std::static_pointer_cast<nn::Module>(lt::small_mlp(3)); },
          [](nn::Module& m, const Tensor& x, const Tensor& y) {
            return rt::cross_entropy(m.forward(x), y);
          },
          [](int64_t batches) {
            const lt::Batch b = lt::global_batch(batches * kRows, 21);
            return rt::Batch{b.x, b.y};
          }};
}

Task sbn_task() {
  Task t = mlp_task();
  t.make = [](std::shared_ptr<ProcessGroup> group) {
    rt::Generator g(7);
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::Linear>(12, 8, true, g));
    if (group) {
      m->push_back(std::make_shared<nn::SyncBatchNorm>(8, group));
    } else {
      m->push_back(std::make_shared<nn::BatchNorm1d>(8));
    }
    m->push_back(std::make_shared<nn::ReLU>());
    m->push_back(std::make_shared<nn::Linear>(8, 5, true, g));
    return std::static_pointer_cast<nn::Module>(m);
  };
  return t;
}

lockstep::models::GptConfig tiny_gpt() {
  return {.vocab_size = 32, .block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 16};
}

Task gpt_task() {
  return {[](auto) {
            return std::static_pointer_cast<nn::Module>(lockstep::models::gpt(tiny_gpt(), 3));
          },
          [](nn::Module& m, const Tensor& x, const Tensor& y) {
            // Under DataParallel: a loss per replica, as PyTorch's gather.
            const Tensor loss = m.forward_values({x, y}).tensor(1);
            return loss.dim() == 0 ? loss : rt::mean(loss);
          },
          [](int64_t batches) {
            const auto [idx, targets] = lt::tokens(batches * kRows, 8, 32, 5);
            return rt::Batch{idx, targets};
          }};
}

struct Setup {
  std::vector<int64_t> counts;  // batches per rank
  nn::DdpOptions ddp;
  // Wraps the model before DDP (DataParallel, Checkpoint); identity if empty.
  std::function<std::shared_ptr<nn::Module>(std::shared_ptr<nn::Module>)> wrap;
  std::optional<nn::CommHook> hook;
  int accumulate = 1;  // iterations per optimizer step, all but the last under no_sync
  bool autocast = false;
};

int64_t first_of(const Setup& s, int rank) {
  int64_t first = 0;
  for (int r = 0; r < rank; ++r) first += s.counts[static_cast<size_t>(r)];
  return first;
}

std::vector<Tensor> params_of(nn::Module& m) {
  std::vector<Tensor> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

std::vector<std::vector<Tensor>> train_joined(const Task& task, const Setup& s,
                                              std::vector<std::string>& problems) {
  const int world = static_cast<int>(s.counts.size());
  int64_t total = 0;
  for (int64_t c : s.counts) total += c;
  const rt::Batch all = task.pool(total);
  std::vector<std::vector<Tensor>> out(static_cast<size_t>(world));
  problems = lt::on_ranks(world, [&](int r, auto group) -> std::string {
    const int64_t lo = first_of(s, r) * kRows;
    const int64_t hi = lo + s.counts[static_cast<size_t>(r)] * kRows;
    const rt::TensorDataset data(all.x.slice(0, lo, hi).contiguous(),
                                 all.y.slice(0, lo, hi).contiguous());
    rt::DataLoader loader(data, {.batch_size = kRows});
    auto model = task.make(group);
    std::shared_ptr<nn::Module> inner = s.wrap ? s.wrap(model) : model;
    nn::DistributedDataParallel ddp(inner, group, s.ddp);
    if (s.hook) ddp.register_comm_hook(*s.hook);
    optim::SGD sgd(model->parameters(), {.lr = 0.1});
    nn::Join join(*group);
    int64_t i = 0;
    for (const rt::Batch& b : join.batches(loader)) {
      const bool last = (i + 1) % s.accumulate == 0;
      Tensor loss;
      {
        std::optional<nn::DistributedDataParallel::NoSyncGuard> guard;
        if (!last) guard.emplace(ddp);
        std::optional<rt::AutocastGuard> amp;
        if (s.autocast) amp.emplace(rt::AutocastState{.enabled = true, .dtype = rt::DType::bf16});
        loss = rt::mul(task.loss(ddp, b.x, b.y), 1.0 / s.accumulate);
        amp.reset();
        loss.backward();
      }
      if (last) {
        sgd.step();
        sgd.zero_grad();
      }
      ++i;
    }
    out[static_cast<size_t>(r)] = params_of(*model);
    return "";
  }, "join_models");
  return out;
}

// One process: at each optimizer step, the mean loss over the concatenated
// batches that the active ranks held in the iterations since the last one
// (DDP divides an accumulated sum by the mean of the iterations' active ranks).
std::vector<Tensor> train_reference(const Task& task, const Setup& s) {
  int64_t total = 0, steps = 0;
  for (int64_t c : s.counts) {
    total += c;
    steps = std::max(steps, c);
  }
  const rt::Batch all = task.pool(total);
  auto model = task.make(nullptr);
  optim::SGD sgd(model->parameters(), {.lr = 0.1});
  std::vector<Tensor> xs, ys;
  for (int64_t t = 0; t < steps; ++t) {
    for (size_t r = 0; r < s.counts.size(); ++r) {
      if (s.counts[r] <= t) continue;
      const int64_t lo = (first_of(s, static_cast<int>(r)) + t) * kRows;
      xs.push_back(all.x.slice(0, lo, lo + kRows));
      ys.push_back(all.y.slice(0, lo, lo + kRows));
    }
    if ((t + 1) % s.accumulate != 0) continue;
    const Tensor x = rt::cat(xs).contiguous(), y = rt::cat(ys).contiguous();
    xs.clear();
    ys.clear();
    std::optional<rt::AutocastGuard> amp;
    if (s.autocast) amp.emplace(rt::AutocastState{.enabled = true, .dtype = rt::DType::bf16});
    Tensor loss = task.loss(*model, x, y);
    amp.reset();
    loss.backward();
    sgd.step();
    sgd.zero_grad();
  }
  return params_of(*model);
}

std::string compare(const Task& task, const Setup& s, double tol) {
  std::vector<std::string> problems;
  const auto ranks = train_joined(task, s, problems);
  std::string out = lt::joined(problems);
  if (!out.empty()) return out;
  for (size_t r = 1; r < ranks.size(); ++r)
    for (size_t i = 0; i < ranks[0].size(); ++i)
      if (!lt::bitwise_equal(ranks[r][i], ranks[0][i]))
        out += fmt::format("rank {} parameter {} differs from rank 0's\n", r, i);
  if (tol < 0) return out;
  const auto ref = train_reference(task, s);
  for (size_t i = 0; i < ref.size(); ++i) {
    const auto m = lt::mismatch(fmt::format("parameter {}", i), ranks[0][i], ref[i], tol);
    if (!m.empty()) out += m + "\n";
  }
  return out;
}

// Ranks' batch counts: 0, 1 and several batches of difference, at 2 and 3 ranks.
std::vector<std::vector<int64_t>> shapes() {
  return {{0, 1}, {2, 2}, {1, 3}, {0, 1, 3}, {3, 3, 1}, {2, 4, 0}};
}

std::shared_ptr<nn::Module> data_parallel(std::shared_ptr<nn::Module> m, int devices) {
  return std::make_shared<nn::DataParallel>(
      m, std::vector<rt::Device>(static_cast<size_t>(devices), rt::Device::cpu()));
}

}  // namespace

TEST_CASE("Join: DataParallel inside DDP, the joined rank's empty batch one chunk, equals the "
          "one-process run",
          "[ddp][join][data_parallel]") {
  const auto counts = GENERATE(from_range(shapes()));
  const int devices = GENERATE(2, 3);
  const bool gpt = GENERATE(false, true);
  const int accumulate = GENERATE(1, 2);
  CAPTURE(counts, devices, gpt, accumulate);
  const Setup s{.counts = counts,
                .wrap = [devices](auto m) { return data_parallel(m, devices); },
                .accumulate = accumulate};
  CHECK(compare(gpt ? gpt_task() : mlp_task(), s, 1e-5) == "");
}

TEST_CASE("Join: checkpointing, the GPT's forward_values, SyncBatchNorm, unused-parameter "
          "search, static graphs, no_sync and hooks equal the one-process run",
          "[ddp][join]") {
  const auto counts = GENERATE(from_range(shapes()));
  const std::string which =
      GENERATE(as<std::string>(), "checkpoint", "gpt", "gpt_checkpoint", "sync_bn",
               "sync_bn_checkpoint", "find_unused", "static_graph", "find_unused_accumulate",
               "static_graph_accumulate", "bucket_view_accumulate", "fp16_hook",
               "fp16_hook_accumulate", "autocast");
  CAPTURE(counts, which);
  Setup s{.counts = counts};
  Task task = mlp_task();
  double tol = 1e-5;
  const auto checkpoint = [](std::shared_ptr<nn::Module> m) -> std::shared_ptr<nn::Module> {
    return std::make_shared<nn::Checkpoint>(m);
  };
  if (which.starts_with("gpt")) task = gpt_task();
  if (which.starts_with("sync_bn")) task = sbn_task();
  if (which.ends_with("checkpoint")) s.wrap = checkpoint;
  if (which.ends_with("accumulate")) s.accumulate = 2;
  s.ddp.find_unused_parameters = which.starts_with("find_unused");
  s.ddp.static_graph = which.starts_with("static_graph");
  s.ddp.gradient_as_bucket_view = which.starts_with("bucket_view");
  // Rounded to f16 on the wire, or computed in bf16: ranks bitwise equal only.
  if (which.starts_with("fp16_hook")) {
    s.hook = nn::comm_hooks::fp16_compress();
    tol = -1;
  }
  if (which == "autocast") {
    s.autocast = true;
    tol = -1;
  }
  CHECK(compare(task, s, tol) == "");
}

// SyncBatchNorm cannot be replicated for DataParallel over a group of several
// ranks. Before, only a call whose batch filled more than one chunk made the
// replicas: the rank that had joined, whose empty batch is one chunk, went on
// into SyncBatchNorm's all-gather, which the others had left with the error,
// and waited there until the collective timeout.
TEST_CASE("Join: a SyncBatchNorm under DataParallel inside DDP is refused on every rank, the "
          "joined one too",
          "[ddp][join][data_parallel]") {
  const auto counts = GENERATE(std::vector<int64_t>{0, 1}, std::vector<int64_t>{0, 1, 3});
  CAPTURE(counts);
  const Setup s{.counts = counts, .wrap = [](auto m) { return data_parallel(m, 2); }};
  std::vector<std::string> problems;
  (void)train_joined(sbn_task(), s, problems);
  for (const std::string& p : problems)
    CHECK_THAT(p, Catch::StartsWith("SyncBatchNorm: cannot be replicated for DataParallel"));
}
