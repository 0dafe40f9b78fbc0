#include "lockstep/nn/data_parallel.h"

#include <exception>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/autograd/rebind.h"
#include "lockstep/runtime/cuda_available.h"
#include "lockstep/runtime/device_backend.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops/misc.h"
#include "lockstep/runtime/threads.h"

namespace lockstep::nn {
namespace {

std::vector<Device> every_cuda_device() {
  const runtime::GpuInventory gpus = runtime::probe_gpus();
  LOCKSTEP_CHECK(gpus.count > 0,
                 "DataParallel: no devices given and no CUDA device found ({}); name the "
                 "devices, e.g. {{Device::cpu(), Device::cpu()}} for CPU replicas",
                 gpus.cuda_built ? gpus.unavailable_reason : "lockstep was built without CUDA");
  std::vector<Device> devices;
  for (int i = 0; i < gpus.count; ++i) devices.push_back(Device::cuda(i));
  return devices;
}

// `t` on `device` as a tensor of its own (a copy even where it already is).
Tensor copy_to(const Tensor& t, Device device) {
  return t.device() == device ? t.clone() : t.to(device);
}

}  // namespace

DataParallel::DataParallel(std::shared_ptr<Module> module, std::vector<Device> devices,
                           DataParallelOptions options)
    : module_(std::move(module)),
      devices_(devices.empty() ? every_cuda_device() : std::move(devices)),
      options_(options) {
  LOCKSTEP_CHECK(module_ != nullptr, "DataParallel: the module is null");
  for (const auto& [name, p] : module_->named_parameters()) {
    LOCKSTEP_CHECK(p.device() == devices_[0],
                   "DataParallel: parameter '{}' is on {} but devices[0] is {}; move the module "
                   "there first (module->to({}))",
                   name, p.device().str(), devices_[0].str(), devices_[0].str());
  }
  register_module("module", module_);
}

Module& DataParallel::refreshed_replica(size_t i, const std::vector<Tensor>& params,
                                        const std::vector<Tensor>& buffers) {
  if (replicas_.size() < i) replicas_.resize(i);
  std::shared_ptr<Module>& replica = replicas_[i - 1];
  if (!replica) replica = module_->replicate();
  const Device device = devices_[i];
  const auto replica_params = replica->parameters();
  const auto replica_buffers = replica->buffers();
  LOCKSTEP_CHECK(params.size() == replica_params.size() && buffers.size() == replica_buffers.size(),
                 "DataParallel: {}::replicate() made a module with {} parameters and {} buffers, "
                 "not {} and {}",
                 module_->type_name(), replica_params.size(), replica_buffers.size(),
                 params.size(), buffers.size());
  // Differentiable copies, so that backward through the replica sums into the
  // wrapped module's gradients; plain copies of the buffers, whose updates
  // in the replica are dropped.
  for (size_t k = 0; k < params.size(); ++k)
    runtime::rebind(replica_params[k], copy_to(params[k], device), /*with_history=*/true);
  runtime::NoGradGuard no_grad;
  for (size_t k = 0; k < buffers.size(); ++k)
    runtime::rebind(replica_buffers[k], copy_to(buffers[k], device));
  replica->train(is_training());
  return *replica;
}

Tensor DataParallel::forward(const Tensor& input) {
  LOCKSTEP_CHECK(input.defined(), "DataParallel: the input is undefined");
  const int64_t dims = input.dim();
  const int64_t dim = options_.dim < 0 ? options_.dim + dims : options_.dim;
  LOCKSTEP_CHECK(dim >= 0 && dim < dims,
                 "DataParallel: dim {} is out of range for an input of shape {}", options_.dim,
                 runtime::shape_str(input.shape()));
  const int64_t n = input.size(dim);
  LOCKSTEP_CHECK(n > 0, "DataParallel: the input {} has no rows along dim {} to split",
                 runtime::shape_str(input.shape()), dim);
  const Device out_device = options_.output_device.value_or(devices_[0]);

  // torch.chunk's split: ceil(n / devices) rows per chunk, the last ones shorter.
  const int64_t devices = static_cast<int64_t>(devices_.size());
  const int64_t per = (n + devices - 1) / devices;
  const size_t chunks = static_cast<size_t>((n + per - 1) / per);
  if (chunks == 1) return module_->forward(input.to(devices_[0])).to(out_device);

  std::vector<Tensor> inputs(chunks), outputs(chunks);
  std::vector<Module*> runners(chunks);
  const std::vector<Tensor> params = module_->parameters(), buffers = module_->buffers();
  bool cpu_replicas = false;
  for (size_t i = 0; i < chunks; ++i) {
    const int64_t lo = static_cast<int64_t>(i) * per;
    inputs[i] = input.slice(dim, lo, std::min(n, lo + per)).to(devices_[i]);
    runners[i] = i == 0 ? module_.get() : &refreshed_replica(i, params, buffers);
    cpu_replicas = cpu_replicas || devices_[i].is_cpu();
  }

  // One thread per further chunk; the first runs here.
  const bool grad = runtime::grad_enabled();
  std::vector<std::exception_ptr> errors(chunks);
  const auto run = [&](size_t i) {
    try {
      runtime::set_grad_enabled(grad);
      runtime::CurrentDevice on(devices_[i]);
      // Replica i's nodes run on a thread of their own in backward too.
      std::optional<runtime::AutogradLane> lane;
      if (i > 0) lane.emplace(static_cast<int>(i), devices_[i]);
      outputs[i] = runners[i]->forward(inputs[i]);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  {
    runtime::NumThreadsAtMost one_blas_thread(1, cpu_replicas);
    std::vector<std::thread> threads;
    for (size_t i = 1; i < chunks; ++i) threads.emplace_back(run, i);
    run(0);
    for (auto& t : threads) t.join();
  }
  for (size_t i = 0; i < chunks; ++i) {
    if (!errors[i]) continue;
    try {
      std::rethrow_exception(errors[i]);
    } catch (const std::exception& e) {
      throw Error(fmt::format("DataParallel: replica {} on {}: {}", i, devices_[i].str(), e.what()));
    }
  }

  for (auto& out : outputs) out = out.to(out_device);
  return runtime::cat(outputs, dim);
}

}  // namespace lockstep::nn
