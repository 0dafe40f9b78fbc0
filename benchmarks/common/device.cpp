#include "common/device.h"

#include <vector>

#include "harness.h"
#include "lockstep/runtime/device_backend.h"
#include "lockstep/runtime/error.h"

namespace lockstep::bench {

void synchronize(const runtime::Device& device) {
  if (!device.is_cpu()) runtime::device_backend(device).synchronize(device);
}

std::string device_name(const runtime::Device& device) {
  if (device.is_cpu()) return {};
  return runtime::device_backend(device).name(device);
}

std::string machine_description(const runtime::Device& device) {
  if (!device.is_cuda()) return machine_description();
  return fmt::format("{}, {} (cuda:{})", machine_description(), device_name(device), device.index);
}

namespace {
// The CUDA backend; null where this build has none, which only a request to
// turn `what` on refuses.
const runtime::DeviceBackend* cuda_backend_for(bool on, const char* what) {
  const runtime::DeviceBackend* cuda = runtime::registered_cuda_backend();
  LOCKSTEP_CHECK(cuda != nullptr || !on, "{}: this build of lockstep has no CUDA", what);
  return cuda;
}
}  // namespace

void set_allow_tf32(bool allow) {
  if (const auto* cuda = cuda_backend_for(allow, "--tf32")) cuda->set_allow_tf32(allow);
}

void set_cudnn_benchmark(bool on) {
  if (const auto* cuda = cuda_backend_for(on, "cuDNN benchmark mode")) cuda->set_cudnn_benchmark(on);
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
