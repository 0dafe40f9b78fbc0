// load_fashion_mnist: on small fake files in a scratch directory (layout,
// normalisation, every consistency error), and on the real dataset where the
// Debian package is installed.
#include <catch2/catch.hpp>

#include <filesystem>
#include <iostream>

#include "data/data_test_util.h"
#include "lockstep/models/fashion_mnist.h"
#include "lockstep/runtime/data/loader.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::models;
using namespace lockstep::testing;
using Catch::Contains;

namespace {

// Writes `prefix`-images/labels files for n images whose pixels are all
// `pixel` and whose labels are `labels`.
void write_split(const TempDir& dir, const std::string& prefix, uint32_t n, uint8_t pixel,
                 const Bytes& labels) {
  write_file(dir.file(prefix + "-images-idx3-ubyte.gz"),
             gzip(idx_file(0x08, {n, 28, 28}, Bytes(size_t{n} * 28 * 28, pixel))));
  write_file(dir.file(prefix + "-labels-idx1-ubyte.gz"),
             gzip(idx_file(0x08, {static_cast<uint32_t>(labels.size())}, labels)));
}

}  // namespace

TEST_CASE("load_fashion_mnist reads and normalises a split", "[data][fashion_mnist]") {
  TempDir dir;
  write_split(dir, "train", 3, 255, {9, 0, 4});
  write_split(dir, "t10k", 2, 0, {1, 2});

  TensorDataset train = load_fashion_mnist(dir.str(), Split::train);
  CHECK(train.x().shape() == Shape{3, 1, 28, 28});
  CHECK(train.x().dtype() == DType::f32);
  CHECK(train.y().dtype() == DType::i64);
  CHECK(train.y().to_vector<int64_t>() == std::vector<int64_t>{9, 0, 4});
  // (255 / 255 - 0.2860) / 0.3530
  CHECK(train.x().data_ptr<float>()[0] == Approx((1.0 - 0.2860) / 0.3530));

  TensorDataset test = load_fashion_mnist(dir.str(), Split::test, {.mean = 0.5f, .std = 2.0f});
  CHECK(test.size() == 2);
  CHECK(test.x().data_ptr<float>()[0] == Approx((0.0 - 0.5) / 2.0));

  // An uncompressed copy is found too.
  std::filesystem::remove(dir.file("t10k-labels-idx1-ubyte.gz"));
  write_file(dir.file("t10k-labels-idx1-ubyte"), idx_file(0x08, {2}, {3, 4}));
  CHECK(load_fashion_mnist(dir.str(), Split::test).y().to_vector<int64_t>() ==
        std::vector<int64_t>{3, 4});
}

TEST_CASE("load_fashion_mnist reads torchvision's root, which holds the files in "
          "FashionMNIST/raw",
          "[data][fashion_mnist]") {
  TempDir root;
  std::filesystem::create_directories(root.file("FashionMNIST/raw"));
  TempDir raw;  // the files, then moved where torchvision's download puts them
  write_split(raw, "t10k", 2, 255, {7, 1});
  for (const char* name : {"t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"})
    std::filesystem::rename(raw.file(name), root.file(std::string("FashionMNIST/raw/") + name));
  CHECK(load_fashion_mnist(root.str(), Split::test).y().to_vector<int64_t>() ==
        std::vector<int64_t>{7, 1});
  // Files directly in the directory come first.
  write_split(root, "t10k", 1, 0, {3});
  CHECK(load_fashion_mnist(root.str(), Split::test).y().to_vector<int64_t>() ==
        std::vector<int64_t>{3});
  // Where neither holds them, the error names both places.
  CHECK_THAT(error_of([&] { load_fashion_mnist(root.str(), Split::train); }),
             Contains("train-images-idx3-ubyte.gz not found") &&
                 Contains(root.file("FashionMNIST/raw")));
}

TEST_CASE("load_fashion_mnist loads the first max_samples samples", "[data][fashion_mnist]") {
  TempDir dir;
  write_split(dir, "train", 3, 255, {9, 0, 4});
  const Normalization norm = kFashionMnistNormalization;
  TensorDataset first = load_fashion_mnist(dir.str(), Split::train, norm, 2);
  CHECK(first.x().shape() == Shape{2, 1, 28, 28});
  CHECK(first.y().to_vector<int64_t>() == std::vector<int64_t>{9, 0});
  CHECK(load_fashion_mnist(dir.str(), Split::train, norm, 10).size() == 3);
  CHECK(load_fashion_mnist(dir.str(), Split::train, norm, 0).size() == 3);
  CHECK_THAT(error_of([&] { load_fashion_mnist(dir.str(), Split::train, norm, -1); }),
             Contains("max_samples must be >= 0"));
}

TEST_CASE("load_fashion_mnist: clear errors for bad directories and files",
          "[data][fashion_mnist]") {
  TempDir dir;
  CHECK_THAT(error_of([&] { load_fashion_mnist(dir.file("absent"), Split::train); }),
             Contains("directory " + dir.file("absent") + " does not exist") &&
                 Contains("--data DIR"));
  CHECK_THAT(error_of([&] { load_fashion_mnist(dir.str(), Split::train); }),
             Contains("train-images-idx3-ubyte.gz not found"));

  write_split(dir, "train", 3, 1, {1, 2});
  CHECK_THAT(error_of([&] { load_fashion_mnist(dir.str(), Split::train); }),
             Contains("holds 3 images but") && Contains("holds 2 labels"));
  // Loading only the first samples still compares the files' whole counts.
  CHECK_THAT(error_of([&] {
               load_fashion_mnist(dir.str(), Split::train, kFashionMnistNormalization, 2);
             }),
             Contains("holds 3 images but") && Contains("holds 2 labels"));
  write_split(dir, "train", 2, 1, {1, 2, 3});
  CHECK_THAT(error_of([&] {
               load_fashion_mnist(dir.str(), Split::train, kFashionMnistNormalization, 1);
             }),
             Contains("holds 2 images but") && Contains("holds 3 labels"));

  write_split(dir, "train", 3, 1, {1, 10, 2});
  CHECK_THAT(error_of([&] { load_fashion_mnist(dir.str(), Split::train); }),
             Contains("label 10 of sample 1 is out of range [0, 10)"));

  write_file(dir.file("train-images-idx3-ubyte.gz"),
             gzip(idx_file(0x08, {3, 28, 27}, Bytes(3 * 28 * 27, 0))));
  CHECK_THAT(error_of([&] { load_fashion_mnist(dir.str(), Split::train); }),
             Contains("expected u8 images of shape [N, 28, 28], got u8 [3, 28, 27]"));

  // A malformed file reports the IDX reader's error with its path.
  write_file(dir.file("train-images-idx3-ubyte.gz"), Bytes{0x1f, 0x8b, 8, 0});
  CHECK_THAT(error_of([&] { load_fashion_mnist(dir.str(), Split::train); }),
             Contains("train-images-idx3-ubyte.gz") && Contains("gzip stream is cut off"));
}

TEST_CASE("Fashion-MNIST from the installed dataset", "[data][fashion_mnist]") {
  if (!std::filesystem::is_directory(kFashionMnistDir)) {
    // Without the package, the error must say how to get it.
    CHECK_THAT(error_of([] { load_fashion_mnist(); }),
               Contains("apt-get install dataset-fashion-mnist") && Contains("--data DIR"));
    std::cout << "SKIPPED: " << kFashionMnistDir
              << " is absent (apt-get install dataset-fashion-mnist)\n";
    return;
  }
  TensorDataset train = load_fashion_mnist(kFashionMnistDir, Split::train);
  TensorDataset test = load_fashion_mnist(kFashionMnistDir, Split::test);
  CHECK(train.x().shape() == Shape{60000, 1, 28, 28});
  CHECK(train.y().shape() == Shape{60000});
  CHECK(test.x().shape() == Shape{10000, 1, 28, 28});
  CHECK(test.y().shape() == Shape{10000});

  // The first training image is an ankle boot (class 9).
  CHECK(train.y().data_ptr<int64_t>()[0] == 9);
  // Labels in range, and balanced: 6000 of each class in the training set.
  std::vector<int64_t> counts(10, 0);
  int64_t out_of_range = 0;
  for (int64_t label : train.y().to_vector<int64_t>()) {
    if (label >= 0 && label < 10) ++counts[static_cast<size_t>(label)];
    else ++out_of_range;
  }
  CHECK(out_of_range == 0);
  CHECK(counts == std::vector<int64_t>(10, 6000));

  // The normalisation constants are the training set's pixel mean and std.
  const float* x = train.x().data_ptr<float>();
  const int64_t n = train.x().numel();
  double sum = 0.0, sum_sq = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    sum += x[i];
    sum_sq += double{x[i]} * x[i];
  }
  const double mean = sum / static_cast<double>(n);
  CHECK(mean == Approx(0.0).margin(0.01));
  CHECK(sum_sq / static_cast<double>(n) - mean * mean == Approx(1.0).margin(0.02));

  DataLoader loader(train, {.batch_size = 64, .shuffle = true, .seed = 0});
  CHECK(loader.num_batches() == 938);
  Batch b = loader.batch(0);
  CHECK(b.x.shape() == Shape{64, 1, 28, 28});
  CHECK(b.y.shape() == Shape{64});
  CHECK(loader.batch(937).size() == 60000 - 937 * 64);

  // The first 2048 samples alone are the same as in the whole set.
  TensorDataset head =
      load_fashion_mnist(kFashionMnistDir, Split::train, kFashionMnistNormalization, 2048);
  REQUIRE(head.size() == 2048);
  CHECK(head.x().to_vector<float>() == train.x().slice(0, 0, 2048).to_vector<float>());
  CHECK(head.y().to_vector<int64_t>() == train.y().slice(0, 0, 2048).to_vector<int64_t>());
}
