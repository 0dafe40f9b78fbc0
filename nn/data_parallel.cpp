#include "lockstep/nn/data_parallel.h"

#include <algorithm>
#include <exception>
#include <optional>
#include <thread>
#include <typeinfo>
#include <unordered_map>

#include <fmt/format.h>

#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/autograd/rebind.h"
#include "lockstep/runtime/cuda_available.h"
#include "lockstep/runtime/device_backend.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/ops/misc.h"
#include "lockstep/runtime/replica_draws.h"
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

// Makes `copy`'s children match `original`'s where they differ. A
// replicate() builds a module from its configuration, so a child replaced
// after construction (convert_sync_batchnorm's SyncBatchNorm in a ResNet, a
// layer swapped by hand) would come out as the kind the constructor makes:
// each such child of the copy is replaced by a replicate of the original's.
// And a module registered twice (Sequential{a, a}) is replicated once, shared
// the same way, so that the replica's parameters match the original's.
// `made`: each original module met so far and its replica.
void match_children(const Module& original, Module& copy,
                    std::unordered_map<const Module*, std::shared_ptr<Module>>& made) {
  const auto& from = original.child_list();
  const auto& to = copy.child_list();
  if (from.size() != to.size()) return;  // the count checks after replicate() name the module
  for (size_t k = 0; k < from.size(); ++k) {
    const auto& [name, o] = from[k];
    if (to[k].first != name) return;
    const std::shared_ptr<Module> c = to[k].second;
    if (auto it = made.find(o.get()); it != made.end()) {
      if (it->second != c) copy.replace_child(name, it->second);
      continue;
    }
    const bool same_kind = typeid(*o) == typeid(*c) && o->extra_repr() == c->extra_repr() &&
                           o->child_list().size() == c->child_list().size();
    const std::shared_ptr<Module> replica = same_kind ? c : o->replicate();
    made.emplace(o.get(), replica);
    match_children(*o, *replica, made);
    if (replica != c) copy.replace_child(name, replica);
  }
}

// Takes no draws: a replicate() builds modules whose constructors initialise
// parameters that are rebound to copies at once, so their draws are thrown
// away, and must not move the generators (the default one included) that
// the model's own draws come from.
class NoDraws final : public runtime::detail::DrawLog {
 public:
  uint64_t reserve(runtime::Generator& g, uint64_t) override { return g.offset(); }
};

// `module.replicate()`, its tree made to match `module`'s.
std::shared_ptr<Module> replicate_tree(const Module& module) {
  NoDraws no_draws;
  runtime::detail::DrawLogScope discarded(&no_draws);
  std::shared_ptr<Module> copy = module.replicate();
  std::unordered_map<const Module*, std::shared_ptr<Module>> made{{&module, copy}};
  match_children(module, *copy, made);
  return copy;
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
  // Bound: replace_child("module", m) (convert_sync_batchnorm on a wrapped
  // BatchNorm) points module_ at m too.
  register_module("module", module_, module_);
}

Module& DataParallel::refreshed_replica(size_t i) {
  if (replicas_.size() < i) replicas_.resize(i);
  std::shared_ptr<Module>& replica = replicas_[i - 1];
  if (!replica) replica = replicate_tree(*module_);
  const Device device = devices_[i];
  // named_modules() walks both trees in the same pre-order, each module once.
  const auto originals = module_->named_modules();
  const auto copies = replica->named_modules();
  LOCKSTEP_CHECK(originals.size() == copies.size(),
                 "DataParallel: {}::replicate() made a module with {} submodules, not {}",
                 module_->type_name(), copies.size(), originals.size());
  // Tensors are bound by position, so the two trees must list the same names
  // in the same order: else a replica's encoder would read the decoder's
  // weights, silently, wherever their shapes agree.
  for (size_t k = 0; k < originals.size(); ++k) {
    LOCKSTEP_CHECK(originals[k].first == copies[k].first,
                   "DataParallel: {}::replicate() made a module whose submodule #{} is '{}', "
                   "but the wrapped module's is '{}'; register the submodules in the same order "
                   "and under the same names as the original",
                   module_->type_name(), k, copies[k].first, originals[k].first);
  }
  // Each tensor slot of the replica reads a copy of the original's tensor in
  // that slot, one copy per original tensor: a weight tied between two
  // modules (an embedding and the output layer) is one copy in the replica
  // too, whose gradient is both uses'. Parameters are differentiable copies,
  // so that backward through the replica sums into the wrapped module's
  // gradients; buffers are plain copies, whose updates in the replica are
  // dropped.
  std::unordered_map<const runtime::TensorImpl*, Tensor> copy_of;  // original -> its copy
  // Replica tensor -> the original it reads, and that original's name.
  std::unordered_map<const runtime::TensorImpl*, std::pair<const runtime::TensorImpl*, std::string>>
      reads;
  const auto bind = [&](size_t m, const NamedList<Tensor>& from, const NamedList<Tensor>& to,
                        const char* what, bool differentiable) {
    const std::string& prefix = originals[m].first;
    LOCKSTEP_CHECK(from.size() == to.size(),
                   "DataParallel: {}::replicate() made a module whose {} '{}' has {} {} of its "
                   "own, not {}",
                   module_->type_name(), originals[m].second->type_name(),
                   prefix.empty() ? "(the root)" : prefix, to.size(), what, from.size());
    for (size_t k = 0; k < from.size(); ++k) {
      const runtime::TensorImpl* original = from[k].second.impl_ptr();
      const std::string name = prefix.empty() ? from[k].first : prefix + "." + from[k].first;
      LOCKSTEP_CHECK(to[k].first == from[k].first,
                     "DataParallel: {}::replicate() made a module whose {} '{}' has '{}' at "
                     "position {} of its {}, where the wrapped module has '{}'; register them in "
                     "the same order and under the same names as the original",
                     module_->type_name(), originals[m].second->type_name(),
                     prefix.empty() ? "(the root)" : prefix, to[k].first, k, what, from[k].first);
      const auto [it, first] = reads.try_emplace(to[k].second.impl_ptr(), original, name);
      LOCKSTEP_CHECK(it->second.first == original,
                     "DataParallel: {}::replicate() made a module in which '{}' and '{}' are one "
                     "tensor, but they are two in the wrapped module",
                     module_->type_name(), it->second.second, name);
      if (!first) continue;
      auto made = copy_of.find(original);
      if (made == copy_of.end())
        made = copy_of.emplace(original, copy_to(from[k].second, device)).first;
      runtime::rebind(to[k].second, made->second, /*with_history=*/differentiable);
    }
  };
  for (size_t k = 0; k < originals.size(); ++k) {
    bind(k, originals[k].second->named_parameters(false),
         copies[k].second->named_parameters(false), "parameters", true);
  }
  runtime::NoGradGuard no_grad;
  for (size_t k = 0; k < originals.size(); ++k) {
    bind(k, originals[k].second->named_buffers(false), copies[k].second->named_buffers(false),
         "buffers", false);
  }
  // Every submodule in the mode of its original, as PyTorch's replicate()
  // copies each module's `training` flag: the wrapped module's (set by
  // model->eval(), or a submodule frozen in eval), not this wrapper's own,
  // which stays true unless dp.eval() is called. A child's own flag is set
  // after its parent's.
  for (size_t k = 0; k < originals.size(); ++k)
    copies[k].second->train(originals[k].second->is_training());
  return *replica;
}

Tensor DataParallel::forward(const Tensor& input) {
  LOCKSTEP_CHECK(input.defined(), "DataParallel: the input is undefined");
  Values out = forward_values(Values{input});
  LOCKSTEP_CHECK(out.size() == 1 && out.is_tensor(0),
                 "DataParallel: the wrapped {} returned {} values; call forward_values() to get "
                 "them all",
                 module_->type_name(), out.size());
  return out.tensor(0);
}

int64_t DataParallel::split_dim(const Tensor& t, size_t position) const {
  const int64_t dims = t.dim();
  const int64_t dim = options_.dim < 0 ? options_.dim + dims : options_.dim;
  LOCKSTEP_CHECK(dim >= 0 && dim < dims,
                 "DataParallel: dim {} is out of range for input {} of shape {}", options_.dim,
                 position, runtime::shape_str(t.shape()));
  return dim;
}

Values DataParallel::forward_values(const Values& inputs) {
  // Every tensor input is split along dim; each must have the same length there.
  int64_t n = -1;
  size_t first = 0;
  for (size_t p = 0; p < inputs.size(); ++p) {
    if (!inputs.is_tensor(p)) continue;
    const Tensor& t = inputs.tensor(p);
    const int64_t rows = t.size(split_dim(t, p));
    if (n < 0) {
      n = rows;
      first = p;
    }
    LOCKSTEP_CHECK(rows == n,
                   "DataParallel: input {} has {} rows along dim {} but input {} has {}; every "
                   "tensor input is split along that dim, so their lengths there must agree",
                   p, rows, options_.dim, first, n);
  }
  LOCKSTEP_CHECK(n >= 0, "DataParallel: none of the {} inputs is a tensor to split",
                 inputs.size());
  const Device out_device = options_.output_device.value_or(devices_[0]);

  // torch.chunk's split: ceil(n / devices) rows per chunk, the last ones shorter.
  // An empty batch (nn::Join's, on a rank whose data has run out) is one
  // chunk: the wrapped module's empty output and zero gradients.
  const int64_t devices = static_cast<int64_t>(devices_.size());
  const int64_t per = std::max<int64_t>((n + devices - 1) / devices, 1);
  const size_t chunks = n == 0 ? 1 : static_cast<size_t>((n + per - 1) / per);
  // Chunk i of the inputs: tensors sliced and moved to devices_[i], the rest as given.
  const auto chunk_of = [&](size_t i) {
    Values chunk;
    for (size_t p = 0; p < inputs.size(); ++p) {
      if (!inputs.is_tensor(p)) {
        chunk.push_back(inputs[p]);
        continue;
      }
      const Tensor& t = inputs.tensor(p);
      const int64_t lo = static_cast<int64_t>(i) * per;
      Tensor part = chunks == 1 ? t : t.slice(split_dim(t, p), lo, std::min(n, lo + per));
      chunk.push_back(part.to(devices_[i]));
    }
    return chunk;
  };
  // One call at a time (a second thread's waits): they share the replicas,
  // which each call rebinds to its own copies, and the wrapped module.
  std::lock_guard<std::mutex> one_call(calls_mutex_);
  // The replicas are kept between calls, as long as the wrapped module's tree
  // is the same: a submodule, parameter or buffer added or a submodule
  // replaced anywhere in it (stamps are never reused) makes them again, as
  // PyTorch replicates at every call.
  std::vector<uint64_t> stamps = module_->structure_stamps();
  const std::vector<uint64_t> buffer_stamps = module_->buffer_stamps();
  stamps.insert(stamps.end(), buffer_stamps.begin(), buffer_stamps.end());
  if (stamps != replica_stamps_) {
    replicas_.clear();
    replica_stamps_ = std::move(stamps);
  }
  // With several devices the first replica is made and checked against the
  // wrapped module whatever the batch, so a module that cannot be replicated
  // (a SyncBatchNorm over several ranks), or whose replicate() builds another
  // tree, is refused at every call: else a rank whose batch fills one chunk
  // (nn::Join's empty one) would go on into the collectives the others left
  // with the error.
  if (devices_.size() > 1 && replicas_.empty()) refreshed_replica(1);
  if (chunks == 1) {
    Values out = module_->forward_values(chunk_of(0));
    // Gathered as PyTorch gathers one output: a scalar becomes a vector of
    // one, as with more replicas; only a single device returns it as it is
    // (PyTorch calls the module directly there).
    const bool gathered = devices_.size() > 1;
    Values moved;
    for (size_t p = 0; p < out.size(); ++p) {
      if (!out.is_tensor(p)) {
        moved.push_back(out[p]);
        continue;
      }
      const Tensor t = out.tensor(p).to(out_device);
      moved.push_back(gathered && t.dim() == 0 ? t.reshape({1}) : t);
    }
    return moved;
  }

  std::vector<Values> chunk_inputs(chunks), outputs(chunks);
  std::vector<Module*> runners(chunks);
  bool cpu_replicas = false;
  for (size_t i = 0; i < chunks; ++i) {
    chunk_inputs[i] = chunk_of(i);
    runners[i] = i == 0 ? module_.get() : &refreshed_replica(i);
    cpu_replicas = cpu_replicas || devices_[i].is_cpu();
  }

  // One thread per further chunk; the first runs here.
  const bool grad = runtime::grad_enabled();
  const runtime::AutocastState autocast = runtime::autocast_state();
  std::vector<std::exception_ptr> errors(chunks);
  // Each replica's dropout masks the same on every run with the seed, however
  // the threads interleave (as each device's generator makes them in PyTorch).
  runtime::ReplicaDrawBlocks draws(chunks);
  const auto run = [&](size_t i) {
    try {
      runtime::ReplicaDrawScope own_draws(draws, i);
      runtime::set_grad_enabled(grad);
      runtime::AutocastGuard same_autocast(autocast);
      runtime::CurrentDevice on(devices_[i]);
      // Replica i's nodes run on a thread of their own in backward too.
      std::optional<runtime::AutogradLane> lane;
      if (i > 0) lane.emplace(static_cast<int>(i), devices_[i]);
      outputs[i] = runners[i]->forward_values(chunk_inputs[i]);
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
  for (size_t i = 0; i < chunks; ++i)
    if (errors[i]) rethrow_naming(errors[i], i);
  return gather(outputs, out_device);
}

// As PyTorch re-raises a replica's exception as its own type: the caller
// catches what the module threw (a lockstep::Error subclass, an
// std::invalid_argument, a type of its own), not a plain Error. Exceptions
// that keep their message in a std::runtime_error or std::logic_error base
// (lockstep's and the standard library's) get the replica and device before
// it, by assigning that base, which keeps the object's type and its other
// fields; others are rethrown as they are.
void DataParallel::rethrow_naming(const std::exception_ptr& error, size_t replica) const {
  const auto named = [&](const char* what) {
    return fmt::format("DataParallel: replica {} on {}: {}", replica, devices_[replica].str(),
                       what);
  };
  try {
    std::rethrow_exception(error);
  } catch (std::runtime_error& e) {
    static_cast<std::runtime_error&>(e) = std::runtime_error(named(e.what()));
    throw;
  } catch (std::logic_error& e) {
    static_cast<std::logic_error&>(e) = std::logic_error(named(e.what()));
    throw;
  }
}

Values DataParallel::gather(const std::vector<Values>& outputs, Device out_device) const {
  const size_t count = outputs[0].size();
  for (size_t i = 1; i < outputs.size(); ++i) {
    LOCKSTEP_CHECK(outputs[i].size() == count,
                   "DataParallel: replica 0 returned {} values but replica {} returned {}", count,
                   i, outputs[i].size());
  }
  Values gathered;
  for (size_t p = 0; p < count; ++p) {
    if (!outputs[0].is_tensor(p)) {  // not gathered: replica 0's, as given
      gathered.push_back(outputs[0][p]);
      continue;
    }
    // A scalar per replica (a loss) becomes one element each, as PyTorch's gather.
    const Tensor& first = outputs[0].tensor(p);
    const bool scalars = first.dim() == 0;
    const int64_t dim = scalars || options_.dim >= 0 ? options_.dim : options_.dim + first.dim();
    LOCKSTEP_CHECK(scalars || (dim >= 0 && dim < first.dim()),
                   "DataParallel: dim {} is out of range for output {} of shape {}, along which "
                   "the replicas' outputs are concatenated",
                   options_.dim, p, runtime::shape_str(first.shape()));
    std::vector<Tensor> parts;
    for (size_t i = 0; i < outputs.size(); ++i) {
      LOCKSTEP_CHECK(outputs[i].is_tensor(p),
                     "DataParallel: output {} is a tensor on replica 0 but {} on replica {}", p,
                     describe(outputs[i][p]), i);
      const Tensor& t = outputs[i].tensor(p);
      bool fits = t.dim() == first.dim();
      for (int64_t d = 0; fits && d < t.dim(); ++d) fits = d == dim || t.size(d) == first.size(d);
      LOCKSTEP_CHECK(fits,
                     "DataParallel: output {} has shape {} on replica {} but {} on replica 0; "
                     "the replicas' outputs are concatenated along dim {} (scalars into a "
                     "vector), so they must agree in every other dim",
                     p, runtime::shape_str(t.shape()), i, runtime::shape_str(first.shape()),
                     options_.dim);
      const Tensor part = t.to(out_device);
      parts.push_back(scalars ? part.reshape({1}) : part);
    }
    gathered.push_back(runtime::cat(parts, scalars ? 0 : dim));
  }
  return gathered;
}

}  // namespace lockstep::nn
