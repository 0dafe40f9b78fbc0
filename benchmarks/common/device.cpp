#include "common/device.h"

#include <vector>

#include "harness.h"
#include "lockstep/config.h"
#include "lockstep/runtime/error.h"

#if LOCKSTEP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/device_guard.h"
#include "lockstep/runtime/cuda/ops/math_mode.h"
#endif

namespace lockstep::bench {

void synchronize(const runtime::Device& device) {
  if (!device.is_cuda()) return;
#if LOCKSTEP_HAVE_CUDA
  runtime::cuda::DeviceGuard guard(device.index);
  LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

std::string device_name(const runtime::Device& device) {
  if (!device.is_cuda()) return {};
#if LOCKSTEP_HAVE_CUDA
  cudaDeviceProp props{};
  LOCKSTEP_CUDA_CHECK(cudaGetDeviceProperties(&props, device.index));
  return props.name;
#else
  return "CUDA device";
#endif
}

std::string machine_description(const runtime::Device& device) {
  if (!device.is_cuda()) return machine_description();
  return fmt::format("{}, {} (cuda:{})", machine_description(), device_name(device), device.index);
}

void set_allow_tf32(bool allow) {
#if LOCKSTEP_HAVE_CUDA
  runtime::cuda::set_allow_tf32(allow);
#else
  LOCKSTEP_CHECK(!allow, "--tf32: this build of lockstep has no CUDA");
#endif
}

double max_over_ranks(collectives::ProcessGroup& group, double value,
                      const runtime::Device& device) {
  runtime::Tensor t = runtime::Tensor::from_vector(std::vector<double>{value}, {1}).to(device);
  group.allreduce(t, {.op = collectives::ReduceOp::Max})->wait();
  return t.item();  // a host read: waits for the all-reduce on a CUDA tensor
}

std::vector<double> gather_over_ranks(collectives::ProcessGroup& group,
                                      const std::vector<double>& values,
                                      const runtime::Device& device) {
  const auto n = static_cast<int64_t>(values.size());
  runtime::Tensor mine = runtime::Tensor::from_vector(values, {n}).to(device);
  runtime::Tensor all = runtime::Tensor::zeros({n * group.size()}, mine.dtype(), device);
  group.allgather(all, mine)->wait();
  return all.to(runtime::Device::cpu()).to_vector<double>();
}

}  // namespace lockstep::bench
