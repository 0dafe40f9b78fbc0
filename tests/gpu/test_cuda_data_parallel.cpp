// nn::DataParallel on CUDA replicas (every GPU there is, and two replicas on
// one GPU) against one CPU model on the whole batch: the gradient of a CNN in
// eval mode (BatchNorm's running statistics, so the split does not matter)
// and of an MLP, within cuDNN's and cuBLAS's summation order.
#include <catch2/catch.hpp>

#include "lockstep/models/models.h"
#include "lockstep/nn/data_parallel.h"
#include "lockstep/runtime/cuda_available.h"
#include "lockstep/runtime/ops.h"
#include "nn/ddp/ddp_fixture.h"
#include "support/gpu_skip.h"
#include "support/test_util.h"

namespace lt = lockstep::testing;
namespace nn = lockstep::nn;
namespace lr = lockstep::runtime;
namespace models = lockstep::models;
using lockstep::runtime::Device;
using lockstep::runtime::Tensor;

TEST_CASE("DataParallel on CUDA replicas equals one CPU model on the whole batch",
          "[gpu][data_parallel]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  const int gpus = lr::probe_gpus().count;
  std::vector<std::vector<Device>> layouts = {{Device::cuda(0), Device::cuda(0)}};
  std::vector<Device> every;
  for (int i = 0; i < gpus; ++i) every.push_back(Device::cuda(i));
  if (gpus > 1) layouts.push_back(every);
  lr::Generator g(4);
  const Tensor x = lr::randn({10, 1, 28, 28}, lr::DType::f32, g);
  std::vector<int64_t> labels(10);
  for (int64_t i = 0; i < 10; ++i) labels[static_cast<size_t>(i)] = i % 10;
  const Tensor y = Tensor::from_vector(labels, {10});
  for (const auto& devices : layouts) {
    INFO(devices.size() << " replicas");
    auto model = models::fashion_cnn(3);
    model->to(devices[0]);
    model->eval();
    nn::DataParallel dp(model, devices, {.output_device = Device::cpu()});
    lr::cross_entropy(dp.forward(x.to(devices[0])), y).backward();
    auto alone = models::fashion_cnn(3);
    alone->eval();
    lr::cross_entropy(alone->forward(x), y).backward();
    const auto a = model->named_parameters(), b = alone->named_parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      INFO(a[i].first);
      CHECK(lt::mismatch(a[i].first, a[i].second.grad().to(Device::cpu()), b[i].second.grad(),
                         1e-3) == "");
    }
  }
}
