// DistributedSampler: disjoint shards that cover the dataset, PyTorch's
// padding and drop_last sizes, one permutation per (seed, epoch) on every
// rank, the uneven evaluation shards, and use through a DataLoader.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>

#include "collectives/rank_threads.h"
#include "lockstep/runtime/data/distributed_sampler.h"
#include "lockstep/runtime/data/loader.h"
#include "lockstep/runtime/random.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

namespace {

std::vector<std::vector<int64_t>> all_shards(int64_t n, int world, DistributedSamplerOptions o,
                                             int64_t epoch = 0) {
  std::vector<std::vector<int64_t>> shards;
  for (int r = 0; r < world; ++r)
    shards.push_back(DistributedSampler(n, r, world, o).indices(epoch));
  return shards;
}

// How often each index appears over all shards.
std::map<int64_t, int> counts(const std::vector<std::vector<int64_t>>& shards) {
  std::map<int64_t, int> c;
  for (const auto& s : shards)
    for (int64_t i : s) ++c[i];
  return c;
}

std::vector<int64_t> iota_vec(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

}  // namespace

TEST_CASE("DistributedSampler: shards are disjoint and cover every index when n divides",
          "[data][sampler]") {
  const bool shuffle = GENERATE(false, true);
  const int world = GENERATE(1, 2, 3, 4);
  const int64_t n = 12;
  const auto shards = all_shards(n, world, {.shuffle = shuffle, .seed = 5});
  const auto c = counts(shards);
  CHECK(static_cast<int64_t>(c.size()) == n);
  for (const auto& [index, times] : c) {
    CHECK(index >= 0);
    CHECK(index < n);
    CHECK(times == 1);
  }
  for (const auto& s : shards) CHECK(static_cast<int64_t>(s.size()) == n / world);
}

TEST_CASE("DistributedSampler: rank r takes positions r, r+N, ... of the global order",
          "[data][sampler]") {
  // Unshuffled, as PyTorch: rank 1 of 3 over 9 samples gets 1, 4, 7.
  CHECK(DistributedSampler(9, 1, 3, {.shuffle = false}).indices(0) ==
        std::vector<int64_t>{1, 4, 7});
  // Shuffled: the same positions of randperm(n, Generator(seed + epoch)).
  Generator g(7 + 2);
  const std::vector<int64_t> order = randperm(9, g);
  CHECK(DistributedSampler(9, 2, 3, {.seed = 7}).indices(2) ==
        std::vector<int64_t>{order[2], order[5], order[8]});
}

TEST_CASE("DistributedSampler: padding gives every rank ceil(n/N), repeating the first indices",
          "[data][sampler]") {
  // n = 10, N = 4: 3 each; positions 10, 11 wrap to order[0], order[1].
  const auto shards = all_shards(10, 4, {.shuffle = false});
  CHECK(shards[0] == std::vector<int64_t>{0, 4, 8});
  CHECK(shards[1] == std::vector<int64_t>{1, 5, 9});
  CHECK(shards[2] == std::vector<int64_t>{2, 6, 0});
  CHECK(shards[3] == std::vector<int64_t>{3, 7, 1});
  for (int r = 0; r < 4; ++r) CHECK(DistributedSampler(10, r, 4).size() == 3);

  // Fewer samples than ranks: the order repeats as often as needed.
  const auto tiny = all_shards(2, 5, {.shuffle = false});
  for (int r = 0; r < 5; ++r) CHECK(tiny[r] == std::vector<int64_t>{r % 2});

  // Every index still appears, shuffled too.
  const auto c = counts(all_shards(10, 4, {.seed = 3}));
  CHECK(c.size() == 10);

  CHECK(all_shards(0, 3, {}) == std::vector<std::vector<int64_t>>(3));
}

TEST_CASE("DistributedSampler: drop_last gives every rank floor(n/N), disjoint",
          "[data][sampler]") {
  const bool shuffle = GENERATE(false, true);
  const auto shards = all_shards(10, 4, {.shuffle = shuffle, .drop_last = true});
  for (const auto& s : shards) CHECK(s.size() == 2);
  const auto c = counts(shards);
  CHECK(c.size() == 8);
  for (const auto& [index, times] : c) CHECK(times == 1);
  for (int r = 0; r < 4; ++r) CHECK(DistributedSampler(10, r, 4, {.drop_last = true}).size() == 2);
  // drop_last wins over pad.
  CHECK(DistributedSampler(10, 0, 4, {.drop_last = true, .pad = true}).size() == 2);
  CHECK(DistributedSampler(3, 2, 4, {.drop_last = true}).indices(0).empty());
}

TEST_CASE("DistributedSampler: all ranks share the permutation of (seed, epoch)",
          "[data][sampler]") {
  const int64_t n = 50;
  const int world = 4;
  auto merged = [&](uint64_t seed, int64_t epoch) {
    // Undo the striding: position p = r + k * N came from rank r, slot k.
    const auto shards = all_shards(n, world, {.seed = seed}, epoch);
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int r = 0; r < world; ++r)
      for (size_t k = 0; k < shards[r].size(); ++k) {
        const size_t p = static_cast<size_t>(r) + k * world;
        if (p < order.size()) order[p] = shards[r][k];
      }
    return order;
  };
  Generator g(11 + 3);
  CHECK(merged(11, 3) == randperm(n, g));
  CHECK(merged(11, 3) == merged(11, 3));  // a pure function of (seed, epoch)
  CHECK(merged(11, 3) != merged(11, 4));  // a new order each epoch
  CHECK(merged(11, 3) != merged(12, 3));
  // epoch e with seed s is the order of RandomSampler(n, s) in epoch e.
  CHECK(merged(11, 3) == RandomSampler(n, 11).indices(3));
}

TEST_CASE("DistributedSampler: without pad or drop_last every sample is counted exactly once",
          "[data][sampler]") {
  // The evaluation path: uneven shards, no duplicates.
  const int world = GENERATE(3, 4);
  const bool shuffle = GENERATE(false, true);
  const int64_t n = 10;
  const DistributedSamplerOptions eval{.shuffle = shuffle, .drop_last = false, .pad = false};
  const auto shards = all_shards(n, world, eval);
  const auto c = counts(shards);
  CHECK(c.size() == 10);
  for (const auto& [index, times] : c) CHECK(times == 1);
  int64_t total = 0;
  for (int r = 0; r < world; ++r) {
    const int64_t expected = n / world + (r < n % world ? 1 : 0);
    CHECK(static_cast<int64_t>(shards[r].size()) == expected);
    CHECK(DistributedSampler::shard_size(n, r, world, eval) == expected);
    total += expected;
  }
  CHECK(total == n);
}

TEST_CASE("DistributedSampler: set_epoch chooses the order of indices()", "[data][sampler]") {
  DistributedSampler s(20, 1, 2, {.seed = 4});
  CHECK(s.epoch() == 0);
  CHECK(s.indices() == s.indices(0));
  s.set_epoch(5);
  CHECK(s.epoch() == 5);
  CHECK(s.indices() == s.indices(5));
  CHECK(s.indices() != s.indices(0));
  CHECK_THAT(error_of([&] { s.set_epoch(-1); }), Contains("epoch must be >= 0"));
}

TEST_CASE("DistributedSampler: bad rank, world size or size are refused clearly",
          "[data][sampler]") {
  CHECK_THAT(error_of([] { DistributedSampler(10, 2, 2); }), Contains("rank 2 is outside [0, 2)"));
  CHECK_THAT(error_of([] { DistributedSampler(10, -1, 2); }), Contains("rank -1 is outside"));
  CHECK_THAT(error_of([] { DistributedSampler(10, 0, 0); }), Contains("world_size must be >= 1"));
  CHECK_THAT(error_of([] { DistributedSampler(-1, 0, 1); }), Contains("size must be >= 0"));
  CHECK_THAT(error_of([] { DistributedSampler::shard_size(10, 3, 3, {}); }),
             Contains("outside [0, 3)"));
  CHECK_THAT(error_of([] { DistributedSampler(4, 0, 1).indices(-2); }),
             Contains("epoch must be >= 0"));
}

TEST_CASE("DistributedSampler: a DataLoader batches this rank's shard and passes its epoch",
          "[data][sampler][loader]") {
  const int64_t n = 11;
  std::vector<float> x(static_cast<size_t>(n));
  std::iota(x.begin(), x.end(), 0.0f);
  TensorDataset ds(Tensor::from_vector(x, {n, 1}), Tensor::from_vector(iota_vec(n), {n}));
  const int world = 3;
  std::vector<int64_t> seen;
  for (int r = 0; r < world; ++r) {
    const DistributedSamplerOptions o{.seed = 9, .pad = false};
    DataLoader loader(ds, std::make_unique<DistributedSampler>(n, r, world, o),
                      {.batch_size = 2});
    for (int64_t epoch : {0, 1}) {
      loader.set_epoch(epoch);
      std::vector<int64_t> got;
      for (const Batch& b : loader) {
        const auto y = b.y.to_vector<int64_t>();
        got.insert(got.end(), y.begin(), y.end());
      }
      CHECK(got == DistributedSampler(n, r, world, o).indices(epoch));
      CHECK(loader.num_samples() == DistributedSampler::shard_size(n, r, world, o));
      if (epoch == 1) seen.insert(seen.end(), got.begin(), got.end());
    }
  }
  std::sort(seen.begin(), seen.end());
  CHECK(seen == iota_vec(n));
}

TEST_CASE("DistributedSampler: under a DataLoader its own set_epoch is refused, not ignored",
          "[data][sampler][loader]") {
  const int64_t n = 12;
  std::vector<float> x(static_cast<size_t>(n));
  std::iota(x.begin(), x.end(), 0.0f);
  TensorDataset ds(Tensor::from_vector(x, {n, 1}), Tensor::from_vector(iota_vec(n), {n}));
  const DistributedSamplerOptions o{.seed = 3};
  auto owned = std::make_unique<DistributedSampler>(n, 1, 2, o);
  DistributedSampler* sampler = owned.get();
  DataLoader loader(ds, std::move(owned), {.batch_size = 6});
  const auto epoch_of = [&] { return loader.batch(0).y.to_vector<int64_t>(); };

  // The loader's set_epoch reaches the sampler: both say the same epoch.
  loader.set_epoch(2);
  CHECK(sampler->epoch() == 2);
  CHECK(sampler->indices() == epoch_of());

  // PyTorch's way, sampler.set_epoch(e), would leave the loader on epoch 2's
  // order: a shuffle that silently never changes. It is refused, saying what to call.
  sampler->set_epoch(3);
  const std::string message = error_of([&] { epoch_of(); });
  CHECK_THAT(message, Contains("sampler's set_epoch(3) was called") &&
                          Contains("still batches epoch 2") &&
                          Contains("call loader.set_epoch(3)"));
  CHECK_THAT(error_of([&] {
               for (const Batch& b : loader) (void)b;
             }),
             Contains("call loader.set_epoch(3)"));
  loader.set_epoch(3);
  CHECK(epoch_of() == DistributedSampler(n, 1, 2, o).indices(3));

  // A sampler set to an epoch before the loader took it: the loader starts there.
  auto preset = std::make_unique<DistributedSampler>(n, 1, 2, o);
  preset->set_epoch(4);
  DataLoader later(ds, std::move(preset), {.batch_size = n});
  CHECK(later.epoch() == 4);
  CHECK(later.batch(0).y.to_vector<int64_t>() == DistributedSampler(n, 1, 2, o).indices(4));
}

TEST_CASE("DistributedSampler: a DataLoader refuses one built for another dataset's size",
          "[data][sampler][loader]") {
  // The test set's size given for the training set's sampler: each rank would
  // silently train on the first 4 of 10 samples, every epoch.
  const int64_t n = 10;
  TensorDataset train(Tensor::zeros({n, 1}, DType::f32), Tensor::from_vector(iota_vec(n), {n}));
  CHECK_THAT(error_of([&] {
               DataLoader(train, std::make_unique<DistributedSampler>(4, 0, 2), {});
             }),
             Contains("the sampler was built for a dataset of 4 samples, but the dataset holds "
                      "10; build it with dataset.size()"));
}

TEST_CASE("DistributedSampler: built from a group, it takes the group's rank and size",
          "[data][sampler]") {
  const auto groups = make_groups("shm", 3, "sampler");
  // Built on every rank at once: building from a process group is collective.
  std::vector<bool> same(3, false);
  const auto errors = run_ranks(3, [&](int r) {
    const DistributedSampler from_group(10, *groups[static_cast<size_t>(r)], {.seed = 7});
    const DistributedSampler by_hand(10, r, 3, {.seed = 7});
    same[static_cast<size_t>(r)] = from_group.rank() == r && from_group.world_size() == 3 &&
                                   from_group.indices(2) == by_hand.indices(2);
  });
  for (size_t r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << (errors[r] ? message_of(errors[r]) : ""));
    CHECK(!errors[r]);
    CHECK(same[r]);
  }
}

TEST_CASE("DistributedSampler: ranks built with different seeds, sizes or options all throw",
          "[data][sampler]") {
  // The classic mistake: a seed per rank (seed + rank) shuffles differently
  // on each rank, so the shards overlap and samples are left out.
  struct Case {
    const char* what;
    std::function<DistributedSamplerOptions(int)> options;
    std::function<int64_t(int)> size;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"seed + rank", [](int r) { return DistributedSamplerOptions{.seed = 42u + r}; },
       [](int) { return int64_t{10}; }, "rank 1 has seed 43, rank 0 has seed 42"},
      {"dataset size", [](int) { return DistributedSamplerOptions{}; },
       [](int r) { return int64_t{10 - r}; },
       "rank 1 was built for a dataset of 9 samples, rank 0 for 10"},
      {"drop_last", [](int r) { return DistributedSamplerOptions{.drop_last = r == 1}; },
       [](int) { return int64_t{10}; },
       "rank 1 has drop_last = true, rank 0 has drop_last = false"},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    const auto groups = make_groups("shm", 2, std::string("sampler-") + c.what);
    const auto errors = run_ranks(2, [&](int r) {
      DistributedSampler s(c.size(r), *groups[static_cast<size_t>(r)], c.options(r));
    });
    for (const auto& e : errors) {
      CHECK_THAT(message_of(e), Contains(c.message));
    }
  }
  // Without shuffle the seed is not used: different ones are fine.
  const auto groups = make_groups("shm", 2, "sampler-unshuffled");
  const auto errors = run_ranks(2, [&](int r) {
    DistributedSampler s(10, *groups[static_cast<size_t>(r)],
                         {.shuffle = false, .seed = static_cast<uint64_t>(r)});
  });
  for (const auto& e : errors) CHECK(!e);
}
