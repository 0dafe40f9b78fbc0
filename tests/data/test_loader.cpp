// TensorDataset, samplers and DataLoader: batch shapes and contents, the last
// partial batch, drop_last, and the reproducible per-epoch shuffle.
#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <numeric>

#include "data_test_util.h"
#include "lockstep/runtime/data/loader.h"
#include "lockstep/runtime/random.h"
#include "support/stderr_capture.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

namespace {

// n samples: x[i] = [i, 1000 + i] (f32), y[i] = i (i64), so every batch says
// which samples it holds.
TensorDataset numbered(int64_t n) {
  std::vector<float> x;
  std::vector<int64_t> y;
  for (int64_t i = 0; i < n; ++i) {
    x.push_back(static_cast<float>(i));
    x.push_back(static_cast<float>(1000 + i));
    y.push_back(i);
  }
  return TensorDataset(Tensor::from_vector(x, {n, 2}), Tensor::from_vector(y, {n}));
}

// The sample indices of every batch of the loader's current epoch, in order.
std::vector<int64_t> epoch_order(const DataLoader& loader) {
  std::vector<int64_t> order;
  for (const Batch& b : loader) {
    std::vector<int64_t> y = b.y.to_vector<int64_t>();
    order.insert(order.end(), y.begin(), y.end());
  }
  return order;
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

// Every other index: a stand-in for a sharding sampler.
class EvenSampler : public Sampler {
 public:
  explicit EvenSampler(int64_t n) : n_(n) {}
  std::vector<int64_t> indices(int64_t) const override {
    std::vector<int64_t> v;
    for (int64_t i = 0; i < n_; i += 2) v.push_back(i);
    return v;
  }
  int64_t size() const override { return (n_ + 1) / 2; }

 private:
  int64_t n_;
};

}  // namespace

TEST_CASE("TensorDataset gathers samples in the order asked", "[data][loader]") {
  TensorDataset ds = numbered(10);
  CHECK(ds.size() == 10);
  const std::vector<int64_t> idx = {7, 0, 7, 3};
  Batch b = ds.get_batch(idx);
  CHECK(b.size() == 4);
  CHECK(b.x.shape() == Shape{4, 2});
  CHECK(b.y.dtype() == DType::i64);
  CHECK(b.x.to_vector<float>() == std::vector<float>{7, 1007, 0, 1000, 7, 1007, 3, 1003});
  CHECK(b.y.to_vector<int64_t>() == idx);

  // Samples with several trailing dims are copied whole.
  std::vector<float> img(3 * 4);
  std::iota(img.begin(), img.end(), 0.0f);
  TensorDataset images(Tensor::from_vector(img, {3, 1, 2, 2}),
                       Tensor::from_vector(std::vector<int64_t>{0, 1, 2}, {3}));
  Batch ib = images.get_batch(std::vector<int64_t>{2, 0});
  CHECK(ib.x.shape() == Shape{2, 1, 2, 2});
  CHECK(ib.x.to_vector<float>() == std::vector<float>{8, 9, 10, 11, 0, 1, 2, 3});
}

TEST_CASE("TensorDataset rejects bad inputs", "[data][loader]") {
  TensorDataset ds = numbered(5);
  CHECK_THAT(error_of([&] { ds.get_batch(std::vector<int64_t>{1, 5}); }),
             Contains("index 5 is out of range for 5 samples"));
  CHECK_THAT(error_of([&] { ds.get_batch(std::vector<int64_t>{-1}); }), Contains("index -1"));
  CHECK_THAT(error_of([] {
               TensorDataset(Tensor::zeros({4, 2}), Tensor::zeros({3}, DType::i64));
             }),
             Contains("x has 4 samples but y has 3"));
}

TEST_CASE("DataLoader batches in order, keeping the last partial batch", "[data][loader]") {
  TensorDataset ds = numbered(10);
  DataLoader loader(ds, {.batch_size = 4});
  CHECK(loader.num_batches() == 3);
  CHECK(loader.num_samples() == 10);
  std::vector<Shape> shapes;
  for (const Batch& b : loader) {
    shapes.push_back(b.x.shape());
    CHECK(b.y.shape() == Shape{b.size()});
  }
  CHECK(shapes == std::vector<Shape>{{4, 2}, {4, 2}, {2, 2}});
  CHECK(epoch_order(loader) == iota(10));
  CHECK(loader.batch(2).y.to_vector<int64_t>() == std::vector<int64_t>{8, 9});
  CHECK_THAT(error_of([&] { loader.batch(3); }), Contains("batch 3 is out of range [0, 3)"));
}

TEST_CASE("DataLoader drop_last drops only a partial last batch", "[data][loader]") {
  TensorDataset ds = numbered(10);
  DataLoader drop(ds, {.batch_size = 4, .drop_last = true});
  CHECK(drop.num_batches() == 2);
  CHECK(drop.num_samples() == 8);
  int64_t batches = 0;
  for (const Batch& b : drop) {
    CHECK(b.size() == 4);
    ++batches;
  }
  CHECK(batches == 2);

  DataLoader exact(ds, {.batch_size = 5, .drop_last = true});
  CHECK(exact.num_batches() == 2);
  CHECK(epoch_order(exact) == iota(10));

  DataLoader too_big(ds, {.batch_size = 11, .drop_last = true});
  CHECK(too_big.num_batches() == 0);
  CHECK(too_big.begin() == too_big.end());
  DataLoader one(ds, {.batch_size = 11});
  CHECK(one.num_batches() == 1);
  CHECK(one.batch(0).size() == 10);
}

TEST_CASE("DataLoader: the largest batch_size gives one batch of everything", "[data][loader]") {
  TensorDataset ds = numbered(10);
  const int64_t huge = std::numeric_limits<int64_t>::max();
  DataLoader all(ds, {.batch_size = huge});
  CHECK(all.num_batches() == 1);
  CHECK(all.num_samples() == 10);
  CHECK(epoch_order(all) == iota(10));
  DataLoader drop(ds, {.batch_size = huge, .drop_last = true});
  CHECK(drop.num_batches() == 0);
  CHECK(drop.num_samples() == 0);
}

TEST_CASE("DataLoader shuffle is reproducible per seed and epoch and visits each index once",
          "[data][loader]") {
  const int64_t n = 103;
  TensorDataset ds = numbered(n);
  DataLoader a(ds, {.batch_size = 8, .shuffle = true, .seed = 42});
  DataLoader b(ds, {.batch_size = 8, .shuffle = true, .seed = 42});
  DataLoader other_seed(ds, {.batch_size = 8, .shuffle = true, .seed = 43});

  std::vector<std::vector<int64_t>> orders;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    a.set_epoch(epoch);
    b.set_epoch(epoch);
    CHECK(a.epoch() == epoch);
    std::vector<int64_t> order = epoch_order(a);
    // Same seed and epoch: the same order, as on another process.
    CHECK(epoch_order(b) == order);
    // The documented rule, so other implementations can reproduce it.
    Generator g(42 + static_cast<uint64_t>(epoch));
    CHECK(order == randperm(n, g));
    // Every index exactly once.
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == iota(n));
    CHECK(order != iota(n));
    orders.push_back(order);
  }
  // A new epoch reshuffles; going back to an epoch gives its order again.
  CHECK(orders[0] != orders[1]);
  CHECK(orders[1] != orders[2]);
  a.set_epoch(0);
  CHECK(epoch_order(a) == orders[0]);
  CHECK(epoch_order(other_seed) != orders[0]);
  // Iterating twice without set_epoch repeats the epoch.
  CHECK(epoch_order(a) == orders[0]);

  // With drop_last the tail of the permutation is what is dropped.
  DataLoader dropped(ds, {.batch_size = 8, .shuffle = true, .seed = 42, .drop_last = true});
  std::vector<int64_t> head = epoch_order(dropped);
  CHECK(head.size() == 96);
  CHECK(head == std::vector<int64_t>(orders[0].begin(), orders[0].begin() + 96));
}

TEST_CASE("DataLoader: a new pass over a shuffled epoch without set_epoch says so, once per "
          "loader; other passes say nothing",
          "[data][loader]") {
  // PyTorch's classic: without set_epoch every epoch repeats the first one's
  // shuffle, and nothing says so.
  TensorDataset ds = numbered(20);
  const std::string warning = "a new pass over its batches began without set_epoch()";
  auto count = [](const std::string& text, const std::string& needle) {
    int n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
      ++n;
    return n;
  };
  {
    StderrCapture err;
    DataLoader shuffled(ds, {.batch_size = 8, .shuffle = true, .seed = 5});
    const auto first = epoch_order(shuffled);
    CHECK(err.text().empty());
    CHECK(epoch_order(shuffled) == first);  // repeated, as the warning says
    CHECK_THAT(err.text(), Contains(warning) && Contains("repeats epoch 0's shuffled order") &&
                               Contains("loader.set_epoch(epoch)"));
    (void)epoch_order(shuffled);
    CHECK(count(err.text(), warning) == 1);
  }
  {
    StderrCapture err;
    // set_epoch before each pass (the same epoch again too: asked for).
    DataLoader shuffled(ds, {.batch_size = 8, .shuffle = true, .seed = 5});
    for (int64_t epoch : {0, 1, 1}) {
      shuffled.set_epoch(epoch);
      (void)epoch_order(shuffled);
    }
    // A look at the first batches, then the pass from the start.
    shuffled.set_epoch(2);
    (void)shuffled.batch(0);
    (void)shuffled.batch(1);
    (void)epoch_order(shuffled);
    // An order that does not change with the epoch loses nothing.
    DataLoader sequential(ds, {.batch_size = 8});
    (void)epoch_order(sequential);
    (void)epoch_order(sequential);
    CHECK(err.text().empty());
  }
}

TEST_CASE("DataLoader takes its order from a Sampler", "[data][loader]") {
  TensorDataset ds = numbered(9);
  DataLoader loader(ds, std::make_unique<EvenSampler>(9), {.batch_size = 2});
  CHECK(loader.num_batches() == 3);
  CHECK(epoch_order(loader) == std::vector<int64_t>{0, 2, 4, 6, 8});

  SequentialSampler seq(4);
  CHECK(seq.indices(5) == iota(4));
  RandomSampler rnd(50, 7);
  CHECK(rnd.size() == 50);
  CHECK(rnd.indices(1) == rnd.indices(1));
  CHECK(rnd.indices(1) != rnd.indices(2));
}

TEST_CASE("DataLoader rejects bad options", "[data][loader]") {
  TensorDataset ds = numbered(4);
  CHECK_THAT(error_of([&] { DataLoader(ds, {.batch_size = 0}); }),
             Contains("batch_size must be >= 1, got 0"));
  CHECK_THAT(error_of([&] {
               DataLoader(ds, std::make_unique<SequentialSampler>(4), {.shuffle = true});
             }),
             Contains("shuffle is set but a sampler was given"));
  // A seed the sampler would never see: every run would get the sampler's order.
  CHECK_THAT(error_of([&] {
               DataLoader(ds, std::make_unique<RandomSampler>(4, 1), {.seed = 7});
             }),
             Contains("seed 7 is set but a sampler was given") &&
                 Contains("give the seed to the sampler"));
  // The loader's own RandomSampler takes the seed: no refusal there.
  DataLoader seeded(ds, {.shuffle = true, .seed = 7});
  Generator g(7);
  CHECK(epoch_order(seeded) == randperm(4, g));
  CHECK_THAT(error_of([&] { DataLoader(ds, std::make_unique<EvenSampler>(9), {}); }),
             Contains("the sampler gave index 4 for a dataset of 4"));
  // A sampler built for another dataset's size: a smaller one would silently
  // train on a part of this one, a larger one give indices past its end.
  for (int64_t n : {3, 5}) {
    CHECK_THAT(error_of([&] { DataLoader(ds, std::make_unique<SequentialSampler>(n), {}); }),
               Contains(fmt::format("sampler was built for a dataset of {} samples, but the "
                                    "dataset holds 4",
                                    n)));
    CHECK_THAT(error_of([&] { DataLoader(ds, std::make_unique<RandomSampler>(n, 0), {}); }),
               Contains("build it with dataset.size()"));
  }
  DataLoader loader(ds, {});
  CHECK_THAT(error_of([&] { loader.set_epoch(-1); }), Contains("epoch must be >= 0"));
}

namespace {

// A sampler whose size() says 3 while it gives 2 indices.
class MiscountingSampler : public Sampler {
 public:
  std::vector<int64_t> indices(int64_t) const override { return {0, 1}; }
  int64_t size() const override { return 3; }
};

}  // namespace

TEST_CASE("DataLoader names a sampler whose size() disagrees with its indices",
          "[data][loader]") {
  TensorDataset ds = numbered(4);
  const std::string message =
      error_of([&] { DataLoader(ds, std::make_unique<MiscountingSampler>(), {}); });
  CHECK_THAT(message, Contains("the sampler gave 2 indices for epoch 0, but its size() is 3") &&
                          !Contains("internal error"));
}
