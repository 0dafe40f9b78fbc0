// SyncBatchNorm on CUDA tensors against BatchNorm on the CPU (what is compared
// and the tolerances: tests/nn/sync_bn_check.h), device memory poisoned first
// so that an element never written fails:
//   in one process, one thread per rank over gloo with the CUDA tensors
//   staged through host memory, all ranks on cuda:0: shapes that take every
//   kernel path (rows and planes, one and several chunks per channel), both
//   dtypes, the options, uneven and empty local batches, and the errors;
//   in real processes (tests/workers/sync_bn_worker.cpp --device cuda through
//   lockstep-run): 2 and 3 processes sharing one GPU over gloo, and 2 over
//   NCCL where there are 2 GPUs (NCCL refuses two ranks on one device).
#include <catch2/catch.hpp>

#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lockstep/collectives/backends.h"
#include "lockstep/config.h"
#include "support/gpu_skip.h"
#include "support/subprocess.h"

#if LOCKSTEP_HAVE_CUDA
#include <cmath>
#include <cstdint>
#include <tuple>

#include "gpu/cuda_op_check.h"
#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/kernels/norm.h"
#include "lockstep/runtime/cuda/ops/sync_batch_norm.h"
#include "lockstep/runtime/cuda/stream.h"
#include "lockstep/runtime/cuda/tensor_args.h"
#endif

#if LOCKSTEP_HAVE_CUDA && LOCKSTEP_HAVE_GLOO
#include <memory>

#include "collectives/rank_threads.h"
#include "gpu/cuda_op_check.h"
#include "lockstep/collectives/cuda_staging/staging_group.h"
#include "lockstep/nn/container.h"
#include "lockstep/nn/normalization.h"
#include "lockstep/nn/sync_batch_norm.h"
#include "nn/sync_bn_check.h"
#endif

namespace lt = lockstep::testing;
using namespace std::chrono_literals;

namespace {

void run_worker(int ranks, const std::string& backend) {
  if (!lockstep::collectives::is_built_in(backend)) {
    std::cout << "SKIPPED: lockstep built without " << backend << "\n";
    return;
  }
  const auto result = lt::run_process(
      {lt::bin_path("lockstep-run"), "-np", std::to_string(ranks), "--tag-output",
       lt::bin_path("sync_bn_worker"), "--backend", backend, "--device", "cuda"},
      300s, {"LOCKSTEP_TIMEOUT_S=120"});
  INFO(lt::describe(result) << "\n" << result.output);
  CHECK(result.ok());
  for (int r = 0; r < ranks; ++r)
    CHECK(result.output.find(fmt::format("sync_bn_worker rank {}/{}: OK (", r, ranks)) !=
          std::string::npos);
  CHECK(result.output.find("MISMATCH") == std::string::npos);
}

}  // namespace

TEST_CASE("SyncBatchNorm on CUDA, 2 processes sharing one GPU over gloo, equals BatchNorm",
          "[gpu][syncbn][multiprocess]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  run_worker(2, "gloo");
}

TEST_CASE("SyncBatchNorm on CUDA, 3 processes sharing one GPU over gloo, one empty",
          "[gpu][syncbn][multiprocess]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  run_worker(3, "gloo");
}

TEST_CASE("SyncBatchNorm on CUDA, 2 processes on 2 GPUs over NCCL, equals BatchNorm",
          "[gpu][syncbn][multiprocess]") {
  LOCKSTEP_SKIP_UNLESS_GPUS(2);
  run_worker(2, "nccl");
}

#if LOCKSTEP_HAVE_CUDA

// Host-side launch geometry (no GPU needed): the shapes of the tests above
// and below take the paths they claim to.
TEST_CASE("SyncBatchNorm reductions: chunks per channel and workspace", "[syncbn][cuda]") {
  namespace k = lockstep::runtime::cuda::kernels;
  CHECK(k::channel_reduce_chunks(0, 3, 5) == 0);  // an empty rank: no partials
  CHECK(k::channel_reduce_chunks(4, 0, 5) == 0);
  CHECK(k::channel_reduce_workspace(0, 3, 5) == sizeof(double));
  CHECK(k::channel_reduce_chunks(3, 4, 5) == 1);
  CHECK(k::channel_reduce_chunks(9, 3, 1600) == 4);  // "several chunks": planes
  CHECK(k::channel_reduce_chunks(150, 40, 1) == 3);  // "several chunks": rows
  CHECK(k::channel_reduce_chunks(70, 40, 1) == 2);
  for (const auto& [n, c, inner] : {std::tuple<int64_t, int64_t, int64_t>{1 << 20, 1, 1 << 12},
                                    {1 << 24, 1, 1}, {256, 2048, 49}, {2, 64, 1 << 18}}) {
    const int64_t chunks = k::channel_reduce_chunks(n, c, inner);
    INFO(n << " x " << c << " x " << inner << ": " << chunks << " chunks");
    CHECK(chunks >= 1);
    CHECK(chunks <= 65535);  // grid.y
    CHECK(k::channel_reduce_workspace(n, c, inner) ==
          static_cast<size_t>(3 * chunks * c) * sizeof(double));
  }
}

namespace {

// The per-chunk partial results channel_stats combines, read back from a
// workspace zeroed first (so that a slot no block wrote reads 0 0 0): what a
// failure of the test below needs to be told apart.
std::string channel_partials(const lockstep::runtime::Tensor& xd) {
  namespace lr = lockstep::runtime;
  namespace k = lr::cuda::kernels;
  const int64_t n = xd.size(0), c = xd.size(1), inner = xd.numel() / (n * c);
  const int64_t chunks = k::channel_reduce_chunks(n, c, inner);
  lr::Tensor ws = lr::Tensor::zeros({3 * chunks * c}, lr::DType::f64, xd.device());
  lr::Tensor out = lr::Tensor::empty({2 * c + 1}, lr::DType::f64, xd.device());
  double* p = out.data_ptr<double>();
  LOCKSTEP_CUDA_CHECK(k::channel_stats(lr::cuda::scalar_type(xd.dtype()), n, c, inner,
                                       xd.raw_data(), p, p + c, p + 2 * c, ws.raw_data(),
                                       lr::cuda::current_stream(xd.device().index).handle));
  const std::vector<double> v = ws.to_vector<double>();
  std::string text = "partials [mean m2 count] by chunk, channel:";
  for (int64_t q = 0; q < chunks; ++q)
    for (int64_t ch = 0; ch < c; ++ch) {
      const size_t at = static_cast<size_t>(3 * (q * c + ch));
      text += fmt::format("\n  {} {}: {} {} {}", q, ch, v[at], v[at + 1], v[at + 2]);
    }
  return text;
}

}  // namespace

// One rank's statistics, before any collective: the kernels alone, for one
// and several chunks per channel, planes and rows, against the definition.
TEST_CASE("SyncBatchNorm's local statistics on CUDA equal the definition", "[gpu][syncbn]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  namespace lr = lockstep::runtime;
  namespace k = lockstep::runtime::cuda::kernels;
  lt::poison_device_memory();
  uint64_t seed = 7;
  for (const lr::Shape& shape : {lr::Shape{3, 4, 5}, lr::Shape{2, 3, 40, 40},
                                 lr::Shape{9, 3, 40, 40}, lr::Shape{7, 3, 40, 40},
                                 lr::Shape{150, 40}, lr::Shape{70, 40}}) {
    const int64_t n = shape[0], c = shape[1], count = lr::shape_numel(shape) / c;
    INFO(lr::shape_str(shape) << ": " << k::channel_reduce_chunks(n, c, count / n) << " chunks");
    // Values around 5 (as after a ReLU), so a mean or variance that is off shows.
    const lr::Tensor x = lr::add(lr::mul(lt::randn_cpu(shape, seed++, lr::DType::f64), 3.0), 5.0);
    const std::vector<double> v = x.to_vector<double>();
    const int64_t inner = count / n;
    std::vector<double> want(static_cast<size_t>(2 * c + 1));
    for (int64_t ch = 0; ch < c; ++ch) {
      double sum = 0, sq = 0;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < inner; ++j) sum += v[static_cast<size_t>((i * c + ch) * inner + j)];
      const double mean = sum / static_cast<double>(count);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < inner; ++j) {
          const double d = v[static_cast<size_t>((i * c + ch) * inner + j)] - mean;
          sq += d * d;
        }
      want[static_cast<size_t>(ch)] = mean;
      want[static_cast<size_t>(c + ch)] = sq / static_cast<double>(count);
    }
    want[static_cast<size_t>(2 * c)] = static_cast<double>(count);
    for (lr::DType dt : {lr::DType::f64, lr::DType::f32}) {
      INFO(lr::dtype_name(dt));
      const lr::Tensor xd = x.to(dt).to(lt::cuda0());
      const lr::Tensor got = lr::cuda::sync_bn::local_stats(xd);
      INFO(channel_partials(xd));
      lt::check_close_to(got, lr::Tensor::from_vector<double>(want, {2 * c + 1}),
                         dt == lr::DType::f64 ? 1e-12 : 1e-6, 1e-6, "mean | var | count");
    }
  }
}

#endif  // LOCKSTEP_HAVE_CUDA

#if LOCKSTEP_HAVE_CUDA && LOCKSTEP_HAVE_GLOO

namespace {

namespace lc = lockstep::collectives;
using lockstep::nn::SyncBatchNorm;
using lockstep::runtime::DType;
using lockstep::runtime::Tensor;
using Catch::Matchers::Contains;

// One group per rank over gloo in this process, taking CUDA tensors.
std::vector<std::shared_ptr<lc::ProcessGroup>> staged_groups(int world, const std::string& name) {
  auto groups = lt::make_groups("gloo", world, name);
  for (auto& g : groups) g = lc::make_cuda_staging_group(g);
  return groups;
}

// Runs `c` on cuda:0 on `world` rank threads; CHECKs that no rank found a mismatch.
void run_case(int world, lt::SyncBnCase c) {
  lt::poison_device_memory();
  c.device = lt::cuda0();
  auto groups = staged_groups(world, "cuda-syncbn");
  std::vector<std::vector<std::string>> found(static_cast<size_t>(world));
  const auto errors = lt::run_ranks(world, [&](int r) {
    found[static_cast<size_t>(r)] = lt::check_sync_bn_rank(groups[static_cast<size_t>(r)], c);
  });
  for (int r = 0; r < world; ++r) {
    INFO("case " << c.name << ", rank " << r);
    CHECK(lt::message_of(errors[static_cast<size_t>(r)]) == "<no exception>");
    for (const auto& e : found[static_cast<size_t>(r)]) FAIL_CHECK(e);
  }
}

}  // namespace

TEST_CASE("SyncBatchNorm on CUDA equals BatchNorm on the CPU, 2 uneven ranks in threads",
          "[gpu][syncbn]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  const DType dtype = GENERATE(DType::f32, DType::f64);
  // [N, C]; L = 5, 7 (does not divide 256) and 300 (longer than a block); H x W.
  const std::vector<int64_t> tail =
      GENERATE(std::vector<int64_t>{}, std::vector<int64_t>{5}, std::vector<int64_t>{7},
               std::vector<int64_t>{300}, std::vector<int64_t>{3, 4});
  run_case(2, {.name = "2 ranks", .batch_sizes = {3, 6}, .channels = 4, .tail = tail,
               .dtype = dtype});
}

TEST_CASE("SyncBatchNorm on CUDA: several chunks per channel", "[gpu][syncbn]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  // Planes: 9 * 1600 values per channel on rank 0, 4 chunks; rows: 150 rows
  // of 40 channels (two tiles, one partial), 3 chunks.
  run_case(2, {.name = "planes", .batch_sizes = {9, 7}, .channels = 3, .tail = {40, 40}});
  run_case(2, {.name = "rows", .batch_sizes = {150, 70}, .channels = 40, .tail = {}});
  run_case(2, {.name = "rows f64", .batch_sizes = {150, 70}, .channels = 40, .tail = {},
               .dtype = DType::f64});
}

TEST_CASE("SyncBatchNorm on CUDA: 4 ranks, one empty, and one value on a rank",
          "[gpu][syncbn]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  const std::vector<int64_t> tail = GENERATE(std::vector<int64_t>{}, std::vector<int64_t>{5},
                                             std::vector<int64_t>{3, 4});
  run_case(4, {.name = "4 ranks", .batch_sizes = {2, 0, 5, 1}, .channels = 3, .tail = tail});
  // Rank 0 has one value per channel: the host reads the global count.
  run_case(2, {.name = "one value on rank 0", .batch_sizes = {1, 3}, .channels = 2, .tail = {}});
}

TEST_CASE("SyncBatchNorm on CUDA: cumulative momentum, no affine, no running stats",
          "[gpu][syncbn]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  run_case(2, {.name = "momentum=None", .batch_sizes = {1, 4}, .tail = {2, 2},
               .options = {.momentum = std::nullopt}, .steps = 3});
  run_case(2, {.name = "affine=false", .batch_sizes = {4, 2}, .tail = {3},
               .options = {.affine = false}});
  run_case(4, {.name = "track_running_stats=false", .batch_sizes = {0, 3, 0, 2}, .tail = {},
               .options = {.track_running_stats = false}});
}

TEST_CASE("SyncBatchNorm on CUDA: one value per channel over all ranks is refused on every "
          "rank, running statistics untouched",
          "[gpu][syncbn]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  auto groups = staged_groups(2, "cuda-syncbn-one");
  std::vector<std::vector<double>> stats(2);
  const auto errors = lt::run_ranks(2, [&](int r) {
    SyncBatchNorm bn(2, groups[static_cast<size_t>(r)]);
    bn.to(lt::cuda0());
    try {
      bn.forward(Tensor::ones({r == 0 ? 1 : 0, 2}, DType::f32, lt::cuda0()));
    } catch (...) {
      stats[static_cast<size_t>(r)] =
          lockstep::runtime::cat({bn.running_mean.to(lockstep::runtime::Device::cpu()),
                                  bn.running_var.to(lockstep::runtime::Device::cpu())})
              .to_vector<double>();
      throw;
    }
  });
  for (const auto& e : errors) CHECK_THAT(lt::message_of(e), Contains("more than 1 value per channel"));
  for (const auto& s : stats) CHECK(s == std::vector<double>{0, 0, 1, 1});
}

TEST_CASE("SyncBatchNorm on CUDA: parameters on another device are refused, naming both",
          "[gpu][syncbn]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  auto groups = staged_groups(2, "cuda-syncbn-devices");
  const auto errors = lt::run_ranks(2, [&](int r) {
    SyncBatchNorm bn(3, groups[static_cast<size_t>(r)]);  // left on the CPU
    bn.forward(Tensor::ones({4, 3}, DType::f32, lt::cuda0()));
  });
  for (const auto& e : errors) {
    CHECK_THAT(lt::message_of(e), Contains("cuda:0") && Contains("cpu") && Contains("weight"));
  }
}

TEST_CASE("convert_sync_batchnorm keeps a CUDA model's BatchNorm on its device",
          "[gpu][syncbn]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  auto groups = staged_groups(1, "cuda-syncbn-convert");
  auto sequential = std::make_shared<lockstep::nn::Sequential>();
  sequential->push_back(std::make_shared<lockstep::nn::BatchNorm2d>(3));
  sequential->to(lt::cuda0());
  const auto model = lockstep::nn::convert_sync_batchnorm(sequential, groups[0]);
  for (const auto& [name, t] : model->state_dict()) {
    INFO(name);
    CHECK(t.device() == lt::cuda0());
  }
  const Tensor y = (*model)(Tensor::ones({2, 3, 4, 4}, DType::f32, lt::cuda0()));
  CHECK(y.device() == lt::cuda0());
}

TEST_CASE("SyncBatchNorm on CUDA: bf16 is refused with a clear error", "[gpu][syncbn]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  auto groups = staged_groups(2, "cuda-syncbn-bf16");
  const auto errors = lt::run_ranks(2, [&](int r) {
    SyncBatchNorm bn(3, groups[static_cast<size_t>(r)]);
    bn.to(DType::bf16);
    bn.to(lt::cuda0());
    bn.forward(Tensor::ones({4, 3}, DType::bf16, lt::cuda0()));
  });
  for (const auto& e : errors) CHECK_THAT(lt::message_of(e), Contains("use f32 or f64"));
}

#endif  // LOCKSTEP_HAVE_CUDA && LOCKSTEP_HAVE_GLOO
