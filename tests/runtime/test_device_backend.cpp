// The device backend table (runtime/device_backend.h): the CPU has none, a
// CUDA build registers CUDA's, and a build without CUDA answers every kernel
// with an error that says so and how to get one.
#include <catch2/catch.hpp>

#include "lockstep/config.h"
#include "lockstep/runtime/device_backend.h"

using namespace lockstep::runtime;
using Catch::Matchers::Contains;

TEST_CASE("device backend: the CPU has none; CUDA's is the build's", "[runtime][device]") {
  CHECK_THROWS_WITH(device_backend(Device::cpu()), Contains("no device backend for cpu"));
  const DeviceBackend& cuda = device_backend(Device::cuda(0));
  if (LOCKSTEP_HAVE_CUDA) {
    CHECK(registered_cuda_backend() == &cuda);
    CHECK(cuda.probe().cuda_built);
    return;
  }
  CHECK(registered_cuda_backend() == nullptr);
  CHECK_FALSE(cuda.probe().cuda_built);
  const Tensor t = Tensor::ones({2});
  CHECK_THROWS_WITH(cuda.unary(UnaryOp::exp, t, 0.0, "exp"),
                    Contains("exp: lockstep was built without CUDA") &&
                        Contains("-DLOCKSTEP_CUDA=ON"));
  CHECK_THROWS_WITH(cuda.softmax_forward(t, 0, true), Contains("log_softmax: lockstep was built"));
  CHECK_THROWS_WITH(cuda.allocate(16, Device::cuda(0)),
                    Contains("cannot allocate 16 bytes on cuda:0: lockstep was built without CUDA"));
  CHECK_THROWS_WITH(cuda.set_current(1), Contains("cannot use cuda:1"));
  // Through the ops: a tensor cannot even be made there.
  CHECK_THROWS_WITH(Tensor::zeros({4}, DType::f32, Device::cuda(0)), Contains("without CUDA"));
}
