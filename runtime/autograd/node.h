// The autograd tape: a Node per recorded op, linked to the nodes of its inputs.
//
// Every node has exactly one output. `next[i]` is the node that receives the
// gradient for input i (the input's grad_fn, or the AccumulateGrad node of a
// leaf), or null when input i needs no gradient.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

class Node {
 public:
  explicit Node(std::string name);
  // Frees the nodes only this one holds one after another, not each inside
  // the destructor of the next: a chain of any length is freed without
  // running out of stack.
  virtual ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Gradients for each input (size == next.size(); undefined where none).
  virtual std::vector<Tensor> apply(const Tensor& grad_output) = 0;
  // Frees what apply() needs; a later apply() then fails with a clear error.
  virtual void release_saved() {}

  // The hooks of this node's output tensor (Tensor::register_hook), which the
  // engine runs on the summed gradient before apply().
  void add_tensor_hook(int64_t id, GradHook fn);
  void remove_tensor_hook(int64_t id);
  bool has_tensor_hooks() const { return has_tensor_hooks_.load(std::memory_order_acquire); }
  Tensor run_tensor_hooks(Tensor grad);

  const std::string& name() const { return name_; }
  uint64_t sequence_nr() const { return sequence_nr_; }
  // The lane recorded with the node (AutogradLane below); 0 by default.
  int lane() const { return lane_; }
  Device lane_device() const { return lane_device_; }

  std::vector<std::shared_ptr<Node>> next;

 private:
  std::string name_;
  uint64_t sequence_nr_;  // creation order; the engine runs later nodes first
  int lane_;
  Device lane_device_;
  std::atomic<bool> has_tensor_hooks_{false};
  std::vector<std::pair<int64_t, GradHook>> tensor_hooks_;  // guarded by a lock in node.cpp
};

// Runs `hooks` in order on `grad`, each on the previous one's result; a hook
// may not change the gradient's shape, dtype or device. `what` names the
// tensor in the error.
Tensor run_grad_hooks(const std::vector<std::pair<int64_t, GradHook>>& hooks, Tensor grad,
                      const std::string& what);

// While alive, the nodes this thread records belong to lane `id` (>= 1) on
// `device`. A backward pass runs each lane's nodes on a thread of its own
// (with `device` current), at the same time as the other lanes', as PyTorch's
// engine runs each device's part of the graph on its own thread; lane 0's
// (every node recorded outside a lane) run on the thread that called
// backward. Gradients that meet in one node are summed in the order of the
// nodes that sent them (by lane, then by recording order within the lane),
// never in the order they arrive, so the bits do not depend on timing. nn::DataParallel records replica i under lane i; a graph
// without lanes runs as before, on the calling thread alone.
class AutogradLane {
 public:
  AutogradLane(int id, Device device);
  ~AutogradLane();
  AutogradLane(const AutogradLane&) = delete;
  AutogradLane& operator=(const AutogradLane&) = delete;

 private:
  int previous_id_;
  Device previous_device_;
};

// A tensor saved for backward. Remembers the storage version at save time so
// that an in-place change before backward is reported instead of silently
// giving a wrong gradient.
// Inside a checkpoint region (autograd/checkpoint.h) it keeps no tensor, only
// its place in the region, which recomputes it on first unpack.
class CheckpointRegion;
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  SavedTensor(std::shared_ptr<CheckpointRegion> region, size_t slot);
  Tensor unpack(const Node& owner, size_t index) const;
  void release();

 private:
  Tensor tensor_;  // detached alias: no reference back into the graph
  std::shared_ptr<CheckpointRegion> region_;
  size_t slot_ = 0;
  uint64_t version_ = 0;
  bool released_ = false;
  bool was_defined_ = false;
};

// What a backward function sees.
struct BackwardArgs {
  const Tensor& grad;                // gradient w.r.t. the op's output
  const std::vector<Tensor>& saved;  // the saved tensors, version-checked
  const std::vector<bool>& needs;    // needs[i]: input i wants a gradient
};
using BackwardFn = std::function<std::vector<Tensor>(const BackwardArgs&)>;

// Records `out` as the result of op `name` applied to `inputs` when grad mode
// is on and some input requires grad; otherwise returns `out` untouched.
// `saved` are the tensors `backward` needs (version-checked on use); anything
// else it needs is captured by value in the lambda. `backward` runs in no-grad
// mode and returns one gradient per input (undefined for inputs not needed).
Tensor record(Tensor out, const char* name, const std::vector<Tensor>& inputs,
              std::vector<Tensor> saved, BackwardFn backward);

// True when an op on `inputs` would be recorded.
bool any_requires_grad(const std::vector<Tensor>& inputs);

}  // namespace lockstep::runtime
