// Fashion-MNIST (https://github.com/zalandoresearch/fashion-mnist): 60000
// training and 10000 test images of 28x28 grey pixels in 10 classes, stored as
// the four gzip IDX files train-{images-idx3,labels-idx1}-ubyte.gz and
// t10k-{images-idx3,labels-idx1}-ubyte.gz.
#pragma once

#include <string>

#include "lockstep/runtime/data/dataset.h"

namespace lockstep::models {

// Where Debian's package `dataset-fashion-mnist` installs the files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
inline constexpr int64_t kFashionMnistClasses = 10;

enum class Split { train, test };

// Pixels are scaled to [0, 1], then normalised: (p / 255 - mean) / std.
struct Normalization {
  float mean = 0.0f;
  float std = 1.0f;
};
// Mean and std of the training pixels, the values PyTorch examples use.
inline constexpr Normalization kFashionMnistNormalization{.mean = 0.2860f, .std = 0.3530f};

// Loads one split from `dir`: x f32 [N, 1, 28, 28] normalised by `norm`,
// y i64 [N] with labels in [0, 10). `max_samples` > 0 loads only the first
// that many samples (all of them where the split holds fewer), reading no
// further into the files. Each file may also be stored uncompressed (the name
// without .gz). A file not in `dir` is looked for in dir/FashionMNIST/raw,
// where torchvision's datasets.FashionMNIST(root=dir, download=True) puts it.
// Errors name the file and the problem; a missing file in the default
// directory says how to install the package.
runtime::TensorDataset load_fashion_mnist(const std::string& dir = kFashionMnistDir,
                                 Split split = Split::train,
                                 Normalization norm = kFashionMnistNormalization,
                                 int64_t max_samples = 0);

}  // namespace lockstep::models
