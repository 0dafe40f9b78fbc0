// nn::DataParallel: one process, several devices, as PyTorch's
// nn.DataParallel.
//
// Each forward splits the input along `dim` into chunks as torch.chunk does
// (ceil(N / devices) rows each, so a small batch gives fewer chunks than
// devices, and an empty one, nn::Join's, runs as one chunk), copies the
// wrapped module's parameters and buffers onto one
// replica per further device, runs the chunks at the same time (one thread
// per device; the first chunk on the wrapped module itself, on devices[0]),
// and concatenates the outputs on the output device. Backward flows back
// through that concatenation, the replicas and the copies, so each
// parameter's gradient is the sum of its replicas' gradients: with a loss
// that is a mean over the whole batch, the gradient of one device on the
// whole batch. Only the first replica's buffer updates persist (BatchNorm's
// running statistics come from the first chunk, as in PyTorch). A parameter
// changed by hand reaches every replica at the next forward.
//
// forward_values (several inputs and outputs): every tensor input is split
// along `dim` (all must have the same length there), other inputs go to every
// replica as given; tensor outputs are concatenated along `dim`, a scalar
// tensor from each replica (a loss) becomes a vector of one per replica, as
// PyTorch's gather makes it (a vector of one when the batch fills a single
// chunk; only with one device is the module's output returned as it is), and
// other outputs are replica 0's.
//
// The replicas are made on first use (the first at the first call, whatever
// its batch, so a module that cannot be replicated is refused at once on
// every rank of a job) and kept while the wrapped module's tree
// stays the same (Module::structure_stamps); a submodule added or replaced
// anywhere in it makes them again at the next forward, so the cache is never
// seen (PyTorch replicates at every call). A replica's children follow the
// original's, including ones replaced after construction, and a submodule
// registered twice is one module in the replica too, as is a tensor held by
// two modules (a weight tied between the embedding and the output layer).
//
// Devices may all be the CPU (CPU replicas, one BLAS thread each while they
// run), so it can be used where there is no GPU. The wrapped module (and each
// submodule) needs replicate() (nn/module.h), which every built-in module has;
// the module it makes must register its submodules, parameters and buffers
// under the original's names and in the original's order (an error names the
// first that differs), since the replica's tensors are bound by position.
// Backward runs the replicas' parts of the graph at the same time too, each
// on a thread of its own (replica i's nodes are recorded under
// runtime::AutogradLane i), and sums their gradients in a fixed order: the
// bits do not depend on which thread finishes first.
//
// Calls from several threads at once are safe: they run one at a time, as
// they share the replicas and the wrapped module (a call's backward may run at
// any time; its graph keeps what it needs).
#pragma once

#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "lockstep/nn/module.h"

namespace lockstep::nn {

struct DataParallelOptions {
  std::optional<Device> output_device;  // where forward returns; default devices[0]
  int64_t dim = 0;                      // the scatter and gather dimension
};

class DataParallel : public Module {
 public:
  // `module` must be on devices[0] already. Empty `devices`: every CUDA
  // device (an error where there is none; name CPU replicas explicitly, as
  // {Device::cpu(), Device::cpu()}).
  DataParallel(std::shared_ptr<Module> module, std::vector<Device> devices = {},
               DataParallelOptions options = {});

  Tensor forward(const Tensor& input) override;
  Values forward_values(const Values& inputs) override;
  std::string type_name() const override { return "DataParallel"; }

  Module& module() { return *module_; }
  const std::shared_ptr<Module>& module_ptr() const { return module_; }
  const std::vector<Device>& devices() const { return devices_; }

 private:
  // Replica i (devices_[i], i >= 1) holding copies of the wrapped module's
  // parameters (differentiable) and buffers (plain), as of this forward.
  Module& refreshed_replica(size_t i);

  // `options_.dim` for input (or output) `position` `t`, checked.
  int64_t split_dim(const Tensor& t, size_t position) const;
  Values gather(const std::vector<Values>& outputs, Device out_device) const;
  // Rethrows `error`, thrown by replica `replica`, as its own type, named.
  [[noreturn]] void rethrow_naming(const std::exception_ptr& error, size_t replica) const;

  std::shared_ptr<Module> module_;
  std::vector<Device> devices_;
  DataParallelOptions options_;
  std::vector<std::shared_ptr<Module>> replicas_;  // [i - 1] for devices_[i]; made on first use
  // module_->structure_stamps() then buffer_stamps(), of the tree the replicas were made of
  std::vector<uint64_t> replica_stamps_;
  std::mutex calls_mutex_;  // held through each forward: one at a time
};

}  // namespace lockstep::nn
