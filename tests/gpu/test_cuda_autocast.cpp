// Autocast on CUDA: each policy row gives the dtype the table says, and its
// output and gradients agree with the CPU's autocast run (the same casts, then
// f32-accumulated math on both: within a unit or two of the low dtype's last
// place); a GPT trained a few steps under bf16 and f16 (with a GradScaler)
// stays near f32 training on the GPU, as on the CPU
// (tests/nn/test_autocast_training.cpp).
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <optional>

#include "gpu/cuda_op_check.h"
#include "lockstep/models/models.h"
#include "lockstep/optim/grad_scaler.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/ops.h"
#include "support/gpu_skip.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
namespace nn = lockstep::nn;
namespace optim = lockstep::optim;
namespace models = lockstep::models;

namespace {

struct Row {
  const char* op;
  bool lower;  // runs at the scope's dtype; otherwise f32
  std::function<Tensor(const std::vector<Tensor>&)> run;
  std::vector<Shape> shapes;
};

std::vector<Row> rows(Device device) {
  const Tensor labels = Tensor::from_vector<int64_t>({0, 2, 1, 2}, {4}).to(device);
  return {
      {"matmul", true, [](auto& in) { return matmul(in[0], in[1]); }, {{16, 32}, {32, 8}}},
      {"linear", true, [](auto& in) { return linear(in[0], in[1], in[2]); },
       {{16, 32}, {8, 32}, {8}}},
      {"conv2d", true, [](auto& in) { return conv2d(in[0], in[1], in[2], {.padding = {1, 1}}); },
       {{2, 3, 8, 8}, {4, 3, 3, 3}, {4}}},
      {"scaled_dot_product_attention", true,
       [](auto& in) { return scaled_dot_product_attention(in[0], in[1], in[2], {.causal = true}); },
       {{2, 9, 16}, {2, 9, 16}, {2, 9, 16}}},
      {"softmax", false, [](auto& in) { return softmax(in[0], 1); }, {{4, 5}}},
      {"cross_entropy", false, [labels](auto& in) { return cross_entropy(in[0], labels); },
       {{4, 3}}},
      {"layer_norm", false, [](auto& in) { return layer_norm(in[0], {5}, in[1], in[2]); },
       {{4, 5}, {5}, {5}}},
      {"sum", false, [](auto& in) { return sum(in[0], {1}); }, {{4, 5}}},
  };
}

// The row's output and its inputs' gradients on `device` under autocast.
std::vector<Tensor> run_row(const Row& row, DType low, Device device) {
  std::vector<Tensor> leaves, src;
  for (size_t i = 0; i < row.shapes.size(); ++i) {
    leaves.push_back(randn_cpu(row.shapes[i], 10 + i, DType::f32).to(device).requires_grad_());
    src.push_back(row.lower ? leaves.back() : leaves.back().to(low));
  }
  Tensor out;
  {
    auto amp = autocast({.dtype = low, .device = device.type});
    out = row.run(src);
  }
  sum(out.to(DType::f32)).backward();
  std::vector<Tensor> result{out};
  for (const Tensor& t : leaves) result.push_back(t.grad());
  return result;
}

}  // namespace

TEST_CASE("CUDA autocast: each policy row's dtype, and its values against the CPU's",
          "[gpu][cuda][autocast]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  for (DType low : {DType::bf16, DType::f16}) {
    const std::vector<Row> on_gpu = rows(cuda0()), on_cpu = rows(Device::cpu());
    for (size_t r = 0; r < on_gpu.size(); ++r) {
      INFO(on_gpu[r].op << " under " << dtype_name(low));
      const auto gpu = run_row(on_gpu[r], low, cuda0());
      const auto cpu = run_row(on_cpu[r], low, Device::cpu());
      CHECK(gpu[0].dtype() == (on_gpu[r].lower ? low : DType::f32));
      CHECK(gpu[0].dtype() == cpu[0].dtype());
      // Two roundings to the low dtype apart at most, on O(1) values.
      const double tol = low == DType::bf16 ? 2e-2 : 3e-3;
      for (size_t i = 0; i < gpu.size(); ++i) {
        CHECK(gpu[i].dtype() == cpu[i].dtype());
        check_close_to(gpu[i], cpu[i], tol, tol, fmt::format("tensor {}", i));
      }
    }
  }
}

TEST_CASE("CUDA autocast: a GPT trained under bf16 and f16 stays near f32 training",
          "[gpu][cuda][autocast]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  const models::GptConfig config{.vocab_size = 64, .block_size = 32, .n_layer = 2, .n_head = 2,
                             .n_embd = 64};
  // Token ids in [0, 62].
  const Tensor tokens = add(small_ints_cpu({4, 33}, 5, 31), 31.0).to(DType::i64).to(cuda0());
  const Tensor idx = tokens.slice(1, 0, 32).contiguous(), targets = tokens.slice(1, 1, 33).contiguous();
  auto train = [&](std::optional<DType> amp) {
    auto model = models::gpt(config, 3);
    model->to(cuda0());
    optim::SGD sgd(model->parameters(), {.lr = 0.05, .momentum = 0.9});
    optim::GradScaler scaler({.init_scale = 1024.0, .enabled = amp == DType::f16});
    std::vector<double> losses;
    for (int step = 0; step < 5; ++step) {
      sgd.zero_grad();
      Tensor loss;
      {
        auto scope = autocast({.dtype = amp.value_or(DType::bf16), .enabled = amp.has_value()});
        loss = model->forward_values({idx, targets}).tensor(1);
      }
      REQUIRE(loss.dtype() == DType::f32);
      scaler.scale(loss).backward();
      for (const Tensor& p : model->parameters()) REQUIRE(p.grad().dtype() == DType::f32);
      losses.push_back(loss.item());
      REQUIRE(scaler.step(sgd));
      scaler.update();
    }
    return losses;
  };
  const auto f32 = train(std::nullopt);
  for (DType low : {DType::bf16, DType::f16}) {
    INFO(dtype_name(low));
    const auto amp = train(low);
    for (size_t i = 0; i < f32.size(); ++i)
      CHECK(std::abs(amp[i] - f32[i]) < (low == DType::bf16 ? 2.5e-2 : 2.5e-3) * std::abs(f32[i]));
  }
}
