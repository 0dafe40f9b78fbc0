// The fused CUDA optimizer steps (one kernel launch for all parameters)
// against the CPU optimizers on the same gradients: SGD with momentum,
// dampening, Nesterov, weight decay and maximize; Adam, AdamW and amsgrad.
// Six steps on several parameters of odd sizes (one empty); then 700
// parameters in two groups with different options, in one launch per step.
// Tolerance: 2e-6 relative plus 1e-7 absolute, as the device may fuse a
// multiply and an add into one FMA where the CPU rounds twice.
#include <catch2/catch.hpp>

#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include "gpu/cuda_op_check.h"
#include "lockstep/optim/adam.h"
#include "lockstep/optim/clip_grad.h"
#include "lockstep/optim/sgd.h"
#include "support/gpu_skip.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/runtime/cuda/ops/fused_optimizer.h"
#endif

using namespace lockstep;
using namespace lockstep::runtime;
using namespace lockstep::testing;

namespace {

const std::vector<Shape> kShapes = {{7, 5}, {13}, {0}, {3, 4, 2}};

using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

// Parameters after six steps with the same gradients on `device`.
std::vector<Tensor> train(Device device, const MakeOptimizer& make) {
  std::vector<Tensor> params;
  for (size_t i = 0; i < kShapes.size(); ++i)
    params.push_back(randn_cpu(kShapes[i], 100 + i).to(device).requires_grad_());
  auto opt = make(params);
  for (int step = 0; step < 6; ++step) {
    for (size_t i = 0; i < params.size(); ++i)
      params[i].set_grad(randn_cpu(kShapes[i], 1000 * step + i).to(device));
    opt->step();
  }
  return params;
}

void check_same_training(const MakeOptimizer& make, const char* what) {
  const auto cpu = train(Device::cpu(), make);
  const auto dev = train(cuda0(), make);
  for (size_t i = 0; i < cpu.size(); ++i)
    check_close_to(dev[i], cpu[i], 2e-6, 1e-7,
                   std::string(what) + ", parameter " + std::to_string(i));
}

}  // namespace

TEST_CASE("fused CUDA SGD matches the CPU step for step", "[gpu][cuda_optim]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  for (const optim::SGDOptions& o :
       {optim::SGDOptions{.lr = 0.1},
        optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-2},
        optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true, .maximize = true}}) {
    check_same_training(
        [&](std::vector<Tensor> p) { return std::make_unique<optim::SGD>(std::move(p), o); },
        "SGD");
  }
}

TEST_CASE("fused CUDA Adam and AdamW match the CPU step for step", "[gpu][cuda_optim]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  optim::AdamOptions adam{.lr = 1e-2, .weight_decay = 1e-2};
  check_same_training(
      [&](std::vector<Tensor> p) { return std::make_unique<optim::Adam>(std::move(p), adam); },
      "Adam with L2");
  adam.amsgrad = true;
  adam.maximize = true;
  check_same_training(
      [&](std::vector<Tensor> p) { return std::make_unique<optim::Adam>(std::move(p), adam); },
      "Adam amsgrad maximize");
  optim::AdamWOptions adamw;
  adamw.lr = 3e-3;
  check_same_training(
      [&](std::vector<Tensor> p) { return std::make_unique<optim::AdamW>(std::move(p), adamw); },
      "AdamW");
}

namespace {

// Fused launches so far; none without CUDA (where these tests are skipped).
int64_t fused_launches() {
#if LOCKSTEP_HAVE_CUDA
  return runtime::cuda::fused_optimizer_launches();
#else
  return 0;
#endif
}

using MakeGrouped =
    std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>;

// 700 parameters of 0 to 40 elements in two groups; after four steps on
// `device`, with the fused launches counted on CUDA.
std::vector<Tensor> train_grouped(Device device, const MakeGrouped& make, int64_t* launches) {
  std::vector<Tensor> first, second;
  for (int i = 0; i < 700; ++i) {
    Tensor p = randn_cpu({i % 41}, 5000 + i).to(device).requires_grad_();
    (i % 3 == 0 ? second : first).push_back(p);
  }
  std::vector<Tensor> all = first;
  all.insert(all.end(), second.begin(), second.end());
  auto opt = make({{first, {}}, {second, {}}});
  const int64_t before = fused_launches();
  for (int step = 0; step < 4; ++step) {
    for (size_t i = 0; i < all.size(); ++i)
      all[i].set_grad(randn_cpu(all[i].shape(), 9000 * step + i).to(device));
    opt->step();
  }
  *launches = fused_launches() - before;
  return all;
}

void check_grouped(const MakeGrouped& make, const char* what) {
  int64_t cpu_launches = 0, launches = 0;
  const auto cpu = train_grouped(Device::cpu(), make, &cpu_launches);
  const auto dev = train_grouped(cuda0(), make, &launches);
  CHECK(cpu_launches == 0);
  CHECK(launches == 4);  // one per step for all 700 parameters of both groups
  for (size_t i = 0; i < cpu.size(); ++i)
    check_close_to(dev[i], cpu[i], 2e-6, 1e-7,
                   std::string(what) + ", parameter " + std::to_string(i));
}

}  // namespace

TEST_CASE("one fused launch steps all parameters of all groups", "[gpu][cuda_optim]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  check_grouped(
      [](std::vector<optim::ParamGroup> g) {
        g[1].options = {{"momentum", 0.0}, {"nesterov", 0.0}, {"weight_decay", 1e-2}, {"lr", 0.3}};
        return std::make_unique<optim::SGD>(
            std::move(g), optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true});
      },
      "SGD, two groups");
  check_grouped(
      [](std::vector<optim::ParamGroup> g) {
        g[1].options = {{"amsgrad", 1.0}, {"maximize", 1.0}, {"lr", 3e-2}};
        return std::make_unique<optim::AdamW>(std::move(g), [] {
          optim::AdamWOptions o;
          o.lr = 1e-2;
          return o;
        }());
      },
      "AdamW, two groups");
}

TEST_CASE("a CUDA optimizer refuses parameters it cannot fuse", "[gpu][cuda_optim]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  Tensor p = randn_cpu({4, 4}, 1).to(DType::bf16).to(cuda0()).requires_grad_();
  p.set_grad(Tensor::zeros({4, 4}, DType::bf16, cuda0()));
  Tensor q = randn_cpu({4}, 2).to(cuda0()).requires_grad_();
  q.set_grad(Tensor::ones({4}, DType::f32, cuda0()));
  const std::vector<double> q_before = q.to(Device::cpu()).to_vector<double>();
  optim::SGD sgd({q, p}, {.lr = 0.1, .momentum = 0.9});
  CHECK_THROWS_WITH(sgd.step(), Catch::Contains("f32") && Catch::Contains("bf16"));
  // Refused before anything changed: q is not stepped and has no buffer.
  CHECK((q.to(Device::cpu()).to_vector<double>() == q_before));
  CHECK(sgd.state_dict().state.empty());
}

TEST_CASE("clip_grad_norm on CUDA gradients equals the CPU's", "[gpu][cuda_optim]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  for (double norm_type : {2.0, 1.0, 3.0, std::numeric_limits<double>::infinity()}) {
    std::vector<Tensor> cpu, dev;
    for (size_t i = 0; i < kShapes.size(); ++i) {
      cpu.push_back(randn_cpu(kShapes[i], 200 + i).requires_grad_());
      cpu.back().set_grad(randn_cpu(kShapes[i], 300 + i));
      dev.push_back(cpu.back().detach().to(cuda0()).requires_grad_());
      dev.back().set_grad(cpu.back().grad().to(cuda0()));
    }
    const double a = optim::clip_grad_norm(cpu, 0.5, norm_type);
    const double b = optim::clip_grad_norm(dev, 0.5, norm_type);
    CHECK(b == a);  // both read the same floats on the host, in double
    for (size_t i = 0; i < cpu.size(); ++i)
      check_close_to(dev[i].grad(), cpu[i].grad(), 1e-6, 1e-7, "clipped gradient " + std::to_string(i));
  }
}
