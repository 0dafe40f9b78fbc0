#include "lockstep/runtime/autograd/node.h"

#include <atomic>
#include <mutex>

#include "lockstep/runtime/autograd/detail/accumulate_grad.h"
#include "lockstep/runtime/autograd/detail/checkpoint_region.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/autograd/detail/meta.h"

namespace lockstep::runtime {

namespace {
std::atomic<uint64_t> g_next_sequence_nr{0};
thread_local int g_lane = 0;
thread_local Device g_lane_device;

constexpr const char* kSecondBackward =
    "{}: trying to backward through the graph a second time (its saved tensors were freed by "
    "the first backward). Pass retain_graph=true to the first backward() if you need to "
    "backward through the graph again.";

// A node whose backward is a lambda over its saved tensors.
class FunctionNode final : public Node {
 public:
  FunctionNode(const char* name, std::vector<SavedTensor> saved, BackwardFn fn,
               std::vector<Device> input_devices)
      : Node(name), saved_(std::move(saved)),
        fn_(std::make_shared<const BackwardFn>(std::move(fn))),
        input_devices_(std::move(input_devices)) {}

  // Backward passes on several threads may run one node of a graph they
  // share (with retain_graph) while one of them releases it: each takes the
  // saved tensors and the function under the lock, and keeps the function
  // alive while it runs.
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    std::vector<Tensor> saved;
    std::shared_ptr<const BackwardFn> fn;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      saved.reserve(saved_.size());
      for (size_t i = 0; i < saved_.size(); ++i) saved.push_back(saved_[i].unpack(*this, i));
      fn = fn_;
    }
    LOCKSTEP_CHECK(fn != nullptr, kSecondBackward, name());  // only undefined tensors saved
    std::vector<bool> needs(next.size());
    for (size_t i = 0; i < next.size(); ++i) needs[i] = next[i] != nullptr;
    std::vector<Tensor> grads = (*fn)(BackwardArgs{grad_output, saved, needs});
    LOCKSTEP_ASSERT(grads.size() == next.size());
    // A gradient must live where its input does: one on another device would
    // be read through the wrong kind of pointer by the next node's kernel.
    for (size_t i = 0; i < grads.size(); ++i)
      LOCKSTEP_CHECK(!grads[i].defined() || !next[i] || grads[i].device() == input_devices_[i],
                     "{}: the gradient for input {} is on {} but the input is on {}", name(), i,
                     grads[i].device().str(), input_devices_[i].str());
    return grads;
  }

  // The backward function goes with the saved tensors: what it captured (a
  // normalisation's statistics, a process group) is freed with them rather
  // than held as long as the graph is. A node that saved nothing keeps it: a
  // second backward through it is no error, as in PyTorch.
  void release_saved() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (SavedTensor& s : saved_) s.release();
    if (!saved_.empty()) fn_ = nullptr;
  }

 private:
  std::mutex mutex_;  // guards saved_ and fn_
  std::vector<SavedTensor> saved_;
  std::shared_ptr<const BackwardFn> fn_;
  std::vector<Device> input_devices_;  // per input, as recorded
};
}  // namespace

Node::Node(std::string name)
    : name_(std::move(name)),
      sequence_nr_(g_next_sequence_nr++),
      lane_(g_lane),
      lane_device_(g_lane_device) {}

// Dropping the last handle on a long chain of nodes (a loss added up over
// many steps, a long unrolled sequence) would destroy each node inside the
// destructor of the one after it, a few stack frames per node, until the
// stack overflows. Instead a dying node takes over the edges of the nodes it
// is the last owner of, and frees them from a list one at a time (as
// PyTorch's deleteNode does). Only AccumulateGrad nodes are also reached
// through weak handles, and they have no edges to take.
Node::~Node() {
  std::vector<std::shared_ptr<Node>> pending;
  for (std::shared_ptr<Node>& edge : next)
    if (edge) pending.push_back(std::move(edge));
  while (!pending.empty()) {
    std::shared_ptr<Node> node = std::move(pending.back());
    pending.pop_back();
    if (node.use_count() != 1) continue;  // another graph or tensor still holds it
    for (std::shared_ptr<Node>& edge : node->next)
      if (edge) pending.push_back(std::move(edge));
  }  // each `node` is freed here with no edges left, so its destructor returns at once
}

namespace {
std::mutex g_tensor_hooks_mutex;  // guards every node's tensor_hooks_
}  // namespace

void Node::add_tensor_hook(int64_t id, GradHook fn) {
  std::lock_guard<std::mutex> lock(g_tensor_hooks_mutex);
  tensor_hooks_.emplace_back(id, std::move(fn));
  has_tensor_hooks_.store(true, std::memory_order_release);
}

void Node::remove_tensor_hook(int64_t id) {
  std::lock_guard<std::mutex> lock(g_tensor_hooks_mutex);
  std::erase_if(tensor_hooks_, [id](const auto& h) { return h.first == id; });
  has_tensor_hooks_.store(!tensor_hooks_.empty(), std::memory_order_release);
}

Tensor Node::run_tensor_hooks(Tensor grad) {
  std::vector<std::pair<int64_t, GradHook>> hooks;
  {
    // A copy: a hook may register or remove hooks.
    std::lock_guard<std::mutex> lock(g_tensor_hooks_mutex);
    hooks = tensor_hooks_;
  }
  return run_grad_hooks(hooks, std::move(grad), "the output of " + name());
}

Tensor run_grad_hooks(const std::vector<std::pair<int64_t, GradHook>>& hooks, Tensor grad,
                      const std::string& what) {
  for (const auto& [id, fn] : hooks) {
    Tensor replaced = fn(grad);
    if (!replaced.defined()) continue;
    LOCKSTEP_CHECK(replaced.shape() == grad.shape() && replaced.dtype() == grad.dtype() &&
                       replaced.device() == grad.device(),
                   "a hook registered with register_hook on {} (hook id {}) returned a gradient "
                   "of shape {} ({}, on {}) for one of shape {} ({}, on {}); a hook must return "
                   "a gradient like the one it got, or an undefined tensor to keep it",
                   what, id, shape_str(replaced.shape()), dtype_name(replaced.dtype()),
                   replaced.device().str(), shape_str(grad.shape()), dtype_name(grad.dtype()),
                   grad.device().str());
    grad = std::move(replaced);
  }
  return grad;
}

AutogradLane::AutogradLane(int id, Device device)
    : previous_id_(g_lane), previous_device_(g_lane_device) {
  LOCKSTEP_CHECK(id >= 1, "AutogradLane: lane ids start at 1 (0 is the calling thread's), got {}",
                 id);
  g_lane = id;
  g_lane_device = device;
}

AutogradLane::~AutogradLane() {
  g_lane = previous_id_;
  g_lane_device = previous_device_;
}

SavedTensor::SavedTensor(const Tensor& t) : was_defined_(t.defined()) {
  if (!t.defined()) return;
  tensor_ = t.detach();
  version_ = t.version();
}

SavedTensor::SavedTensor(std::shared_ptr<CheckpointRegion> region, size_t slot)
    : region_(std::move(region)), slot_(slot), was_defined_(true) {}

void SavedTensor::release() {
  if (region_) region_->release(slot_);
  region_.reset();
  tensor_ = Tensor();
  released_ = true;
}

Tensor SavedTensor::unpack(const Node& owner, size_t index) const {
  if (!was_defined_) return Tensor();
  if (region_) return region_->unpack(slot_, owner, index);
  LOCKSTEP_CHECK(!released_, kSecondBackward, owner.name());
  LOCKSTEP_CHECK(tensor_.version() == version_,
                 "{}: saved tensor {} (shape {}) needed for the gradient was modified by an "
                 "in-place operation: it is at version {}, expected version {}. Use an "
                 "out-of-place op, or clone() the tensor before changing it.",
                 owner.name(), index, shape_str(tensor_.shape()), tensor_.version(), version_);
  return tensor_;
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Tensor record(Tensor out, const char* name, const std::vector<Tensor>& inputs,
              std::vector<Tensor> saved, BackwardFn backward) {
  if (!grad_enabled() || !any_requires_grad(inputs)) return out;
  std::vector<SavedTensor> kept;
  kept.reserve(saved.size());
  if (ActiveRegion* active = active_checkpoint()) {
    if (active->recomputing) {
      active->region->check_reads(name, inputs);
      active->region->collect(name, saved);
      set_grad_fn(out, recomputed_node(name));
      return out;
    }
    // In a checkpoint region: keep places, not tensors.
    active->region->note_inputs(name, inputs);
    const size_t first = active->region->add_slots(name, saved);
    for (size_t i = 0; i < saved.size(); ++i) kept.emplace_back(active->region, first + i);
  } else {
    for (const Tensor& t : saved) kept.emplace_back(t);
  }
  std::vector<Device> devices;
  devices.reserve(inputs.size());
  for (const Tensor& in : inputs) devices.push_back(in.defined() ? in.device() : Device::cpu());
  auto node = std::make_shared<FunctionNode>(name, std::move(kept), std::move(backward),
                                             std::move(devices));
  node->next.reserve(inputs.size());
  for (const Tensor& in : inputs) node->next.push_back(gradient_edge(in));
  set_grad_fn(out, std::move(node));
  return out;
}

AutogradMeta& autograd_meta(TensorImpl& impl) {
  if (!impl.autograd) impl.autograd = std::make_unique<AutogradMeta>();
  return *impl.autograd;
}

std::shared_ptr<Node> gradient_edge(const Tensor& t) {
  if (!t.defined()) return nullptr;
  TensorImpl* impl = t.impl_ptr();
  if (!impl->autograd) return nullptr;
  AutogradMeta& meta = *impl->autograd;
  if (meta.grad_fn) return meta.grad_fn;
  if (!meta.requires_grad) return nullptr;
  std::lock_guard<std::mutex> guard(meta.grad_accumulator_mutex);
  std::shared_ptr<Node> acc = meta.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    meta.grad_accumulator = acc;
  }
  return acc;
}

void set_grad_fn(const Tensor& out, std::shared_ptr<Node> fn) {
  autograd_meta(*out.impl_ptr()).grad_fn = std::move(fn);
}

}  // namespace lockstep::runtime
