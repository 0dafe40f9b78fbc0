#include "lockstep/models/fashion_mnist.h"

#include <array>
#include <filesystem>

#include "lockstep/runtime/data/idx.h"

namespace lockstep::models {

using namespace runtime;

namespace {

namespace fs = std::filesystem;

constexpr int64_t kSide = 28;

bool is_default_dir(const std::string& dir) {
  auto canonical_form = [](fs::path p) {
    p = p.lexically_normal();
    return p.has_filename() ? p : p.parent_path();  // drop a trailing '/'
  };
  return canonical_form(dir) == canonical_form(kFashionMnistDir);
}

// Where torchvision's datasets.FashionMNIST(root) keeps the files under root.
constexpr const char* kTorchvisionSubdir = "FashionMNIST/raw";

// The path of `base`.gz in dir, or of `base` if only the uncompressed file is
// there; failing both, the same in dir/FashionMNIST/raw, so that the root a
// torchvision user passes (which holds the files there) works too. A missing
// file gets an error that says what to do.
std::string find_file(const std::string& dir, const std::string& base) {
  const fs::path gz = fs::path(dir) / (base + ".gz");
  const fs::path plain = fs::path(dir) / base;
  std::error_code ec;
  for (const fs::path& in : {fs::path(dir), fs::path(dir) / kTorchvisionSubdir}) {
    if (fs::exists(in / (base + ".gz"), ec)) return (in / (base + ".gz")).string();
    if (fs::exists(in / base, ec)) return (in / base).string();
  }
  const std::string hint =
      is_default_dir(dir)
          ? "install the dataset with `apt-get install dataset-fashion-mnist`, or pass "
            "--data DIR to read it from another directory"
          : "pass the directory that holds the Fashion-MNIST files (--data DIR); the default "
            "is " + std::string(kFashionMnistDir);
  if (!fs::is_directory(dir, ec))
    throw Error(fmt::format("Fashion-MNIST: directory {} does not exist; {}", dir, hint));
  throw Error(fmt::format("Fashion-MNIST: {} not found (nor {}, nor either in {}); {}",
                          gz.string(), plain.string(),
                          (fs::path(dir) / kTorchvisionSubdir).string(), hint));
}

}  // namespace

TensorDataset load_fashion_mnist(const std::string& dir, Split split, Normalization norm,
                                 int64_t max_samples) {
  LOCKSTEP_CHECK(norm.std > 0.0f, "load_fashion_mnist: normalization std must be > 0, got {}",
                 norm.std);
  LOCKSTEP_CHECK(max_samples >= 0, "load_fashion_mnist: max_samples must be >= 0 (0: all), got {}",
                 max_samples);
  IdxReadOptions read_options;
  if (max_samples > 0) read_options.max_rows = static_cast<uint64_t>(max_samples);
  const std::string prefix = split == Split::train ? "train" : "t10k";
  const std::string images_path = find_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  const IdxArray images = read_idx(images_path, read_options);
  const IdxArray labels = read_idx(labels_path, read_options);

  LOCKSTEP_CHECK(images.type == IdxType::u8 && images.dims.size() == 3 &&
                     images.dims[1] == kSide && images.dims[2] == kSide,
                 "{}: expected u8 images of shape [N, 28, 28], got {} {}", images_path,
                 idx_type_name(images.type), shape_str(images.dims));
  LOCKSTEP_CHECK(labels.type == IdxType::u8 && labels.dims.size() == 1,
                 "{}: expected u8 labels of shape [N], got {} {}", labels_path,
                 idx_type_name(labels.type), shape_str(labels.dims));
  // The counts the headers give, not those loaded: files that do not pair up
  // are refused even when only their first samples are read.
  LOCKSTEP_CHECK(labels.file_rows == images.file_rows,
                 "Fashion-MNIST: {} holds {} images but {} holds {} labels", images_path,
                 images.file_rows, labels_path, labels.file_rows);
  const int64_t n = images.dims[0];

  // (p / 255 - mean) / std for each of the 256 pixel values, computed once.
  std::array<float, 256> lut{};
  for (int p = 0; p < 256; ++p)
    lut[p] = (static_cast<float>(p) / 255.0f - norm.mean) / norm.std;
  Tensor x = Tensor::empty({n, 1, kSide, kSide}, DType::f32);
  float* px = x.data_ptr<float>();
  for (size_t i = 0; i < images.bytes.size(); ++i) px[i] = lut[images.bytes[i]];

  Tensor y = Tensor::empty({n}, DType::i64);
  int64_t* py = y.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t label = labels.bytes[static_cast<size_t>(i)];
    LOCKSTEP_CHECK(label < kFashionMnistClasses,
                   "{}: label {} of sample {} is out of range [0, {})", labels_path, label, i,
                   kFashionMnistClasses);
    py[i] = label;
  }
  return TensorDataset(std::move(x), std::move(y));
}

}  // namespace lockstep::models
