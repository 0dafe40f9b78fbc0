#include "lockstep/runtime/autograd/detail/engine.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <queue>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/autograd/backward_callbacks.h"
#include "lockstep/runtime/autograd/checkpoint.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/autograd/detail/meta.h"
#include "lockstep/runtime/device_backend.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/threads.h"

namespace lockstep::runtime {

namespace {

// The callbacks of each backward pass running on this thread, innermost last
// (a hook may itself run a backward), and the node each pass started from.
thread_local std::vector<std::deque<std::function<void()>>> callback_frames;
thread_local std::vector<const Node*> backward_roots;

// Pops this pass's frame however the pass ends.
struct CallbackFrame {
  explicit CallbackFrame(const Node* root) {
    callback_frames.emplace_back();
    backward_roots.push_back(root);
  }
  ~CallbackFrame() {
    callback_frames.pop_back();
    backward_roots.pop_back();
  }
  CallbackFrame(const CallbackFrame&) = delete;
  CallbackFrame& operator=(const CallbackFrame&) = delete;
  void run_all() {
    while (!callback_frames.back().empty()) {
      auto fn = std::move(callback_frames.back().front());
      callback_frames.back().pop_front();
      fn();
    }
  }
};

struct LaterFirst {
  bool operator()(const Node* a, const Node* b) const {
    return a->sequence_nr() < b->sequence_nr();
  }
};

// Number of edges into each node reachable from `root`.
std::unordered_map<Node*, int> count_dependencies(Node* root) {
  std::unordered_map<Node*, int> deps;
  std::vector<Node*> stack{root};
  deps[root] = 0;
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const auto& next : n->next) {
      if (!next) continue;
      auto [it, inserted] = deps.try_emplace(next.get(), 0);
      ++it->second;
      if (inserted) stack.push_back(next.get());
    }
  }
  return deps;
}

// The nodes a capturing pass runs: those from which a captured node is
// reached through at least one edge (a captured node itself runs only when
// another is below it). Iterative, for graphs of any depth.
std::unordered_set<Node*> nodes_to_run(Node* root, const GradCapture& capture) {
  std::unordered_map<Node*, bool> leads;  // done: leads to a captured node
  std::vector<std::pair<Node*, size_t>> stack{{root, 0}};
  leads.emplace(root, false);
  std::unordered_set<Node*> run;
  while (!stack.empty()) {
    auto& [node, edge] = stack.back();
    if (edge < node->next.size()) {
      Node* next = node->next[edge++].get();
      if (next && leads.try_emplace(next, false).second) stack.push_back({next, 0});
      continue;
    }
    for (const auto& next : node->next) {
      if (next && (capture.at.count(next.get()) || run.count(next.get()))) {
        run.insert(node);
        break;
      }
    }
    stack.pop_back();
  }
  return run;
}

// One node's step: capture its gradient if asked, skip it if a capturing
// pass need not run it, else its tensor hooks and then apply().
struct NodeRunner {
  GradCapture* capture = nullptr;
  std::unordered_set<Node*> run;  // with capture only

  // Whether the pass runs this node; only a node that ran frees its saved
  // tensors, so another backward can still go through the ones it skipped.
  bool runs(Node& node) const { return !capture || run.count(&node); }

  std::vector<Tensor> operator()(Node& node, Tensor input) {
    if (capture) {
      if (auto it = capture->at.find(&node); it != capture->at.end())
        for (size_t i : it->second) capture->grads[i] = input;
      if (!run.count(&node)) return {};
    }
    if (node.has_tensor_hooks()) input = node.run_tensor_hooks(std::move(input));
    return node.apply(input);
  }
};

using ReadyQueue = std::priority_queue<Node*, std::vector<Node*>, LaterFirst>;

// A backward pass over a graph with lanes (AutogradLane in node.h): one thread
// per lane, lane 0 the caller's. Everything shared is guarded by `mutex`; a
// node's apply() runs outside it.
class LanePass {
 public:
  LanePass(std::unordered_map<Node*, int> deps, bool retain_graph, NodeRunner& runner)
      : deps_(std::move(deps)), remaining_(deps_.size()), retain_graph_(retain_graph),
        runner_(runner) {
    for (const auto& entry : deps_) lanes_.try_emplace(entry.first->lane(), entry.first->lane_device());
  }

  void run(Node* root, const Tensor& grad) {
    root_ = root;
    inputs_[root].push_back({{0, 0}, grad});
    ready_[root->lane()].push(root);
    bool cpu_lanes = false;
    for (const auto& [lane, device] : lanes_) cpu_lanes = cpu_lanes || (lane != 0 && device.is_cpu());
    // Several lanes of CPU kernels at once: one BLAS thread each.
    NumThreadsAtMost one_thread(1, cpu_lanes);
    std::vector<std::thread> threads;
    for (const auto& [lane, device] : lanes_) {
      if (lane != 0) threads.emplace_back([this, lane = lane, device = device] { work(lane, device); });
    }
    work(0, Device::cpu());
    for (auto& t : threads) t.join();
    if (error_) std::rethrow_exception(error_);
    for (auto& fn : worker_callbacks_) queue_backward_callback(std::move(fn));
  }

 private:
  // A gradient and who sent it: the sender's lane, and its sequence number
  // negated (within one lane, nodes are numbered in the order one thread
  // recorded them; across lanes the numbers interleave as the threads ran).
  using Sender = std::pair<int, int64_t>;
  using Contribution = std::pair<Sender, Tensor>;

  void work(int lane, Device device) {
    std::unique_ptr<CallbackFrame> frame;
    std::unique_ptr<CurrentDevice> current;
    try {
      if (lane != 0) {
        frame = std::make_unique<CallbackFrame>(root_);
        current = std::make_unique<CurrentDevice>(device);
      }
      NoGradGuard no_grad;
      std::unique_lock<std::mutex> lock(mutex_);
      for (;;) {
        cv_.wait(lock, [&] { return error_ || remaining_ == 0 || !ready_[lane].empty(); });
        if (error_ || remaining_ == 0) break;
        Node* node = ready_[lane].top();
        ready_[lane].pop();
        std::vector<Contribution> contributions = std::move(inputs_[node]);
        inputs_.erase(node);
        lock.unlock();
        std::vector<Tensor> outputs;
        if (Tensor input = summed(contributions); input.defined())
          outputs = runner_(*node, std::move(input));
        contributions.clear();
        if (!retain_graph_ && runner_.runs(*node)) node->release_saved();
        lock.lock();
        for (size_t i = 0; i < node->next.size(); ++i) {
          Node* next = node->next[i].get();
          if (!next) continue;
          if (i < outputs.size() && outputs[i].defined())
            inputs_[next].push_back({sender(*node), std::move(outputs[i])});
          if (--deps_[next] == 0) ready_[next->lane()].push(next);
        }
        --remaining_;
        cv_.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> guard(mutex_);
      if (!error_) error_ = std::current_exception();
      cv_.notify_all();
    }
    if (frame) {
      std::lock_guard<std::mutex> guard(mutex_);
      for (auto& fn : callback_frames.back()) worker_callbacks_.push_back(std::move(fn));
      callback_frames.back().clear();
    }
  }

  static Sender sender(const Node& node) {
    return {node.lane(), -static_cast<int64_t>(node.sequence_nr())};
  }

  // The sum in the order of the senders (by lane, then within a lane latest
  // first, as a pass without lanes adds them), whatever order they arrived in
  // and however the lanes' recording interleaved.
  static Tensor summed(std::vector<Contribution>& contributions) {
    if (contributions.empty()) return Tensor();
    std::sort(contributions.begin(), contributions.end(),
              [](const Contribution& a, const Contribution& b) { return a.first < b.first; });
    Tensor sum = std::move(contributions[0].second);
    for (size_t i = 1; i < contributions.size(); ++i) sum = add(sum, contributions[i].second);
    return sum;
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::unordered_map<Node*, int> deps_;
  std::unordered_map<Node*, std::vector<Contribution>> inputs_;
  std::map<int, ReadyQueue> ready_;
  std::map<int, Device> lanes_;
  size_t remaining_;
  bool retain_graph_;
  NodeRunner& runner_;  // each node runs once: captures go to distinct places
  std::exception_ptr error_;
  std::vector<std::function<void()>> worker_callbacks_;
  const Node* root_ = nullptr;  // the pass's, for running_backward_roots() on every lane
};

}  // namespace

/*
 * The engine runs each node once, after every node that feeds it a gradient
 * has run: a node becomes ready when its dependency count (edges from nodes
 * reachable from the root) reaches zero. Gradients arriving from several
 * consumers are summed in the node's input buffer first, so a tensor used
 * twice gets the sum. Among ready nodes the most recently created runs first,
 * which matches PyTorch's order and makes leaves' AccumulateGrad (and so the
 * post-accumulate hooks DDP relies on) fire as early as possible.
 */
bool in_backward() { return !callback_frames.empty(); }

std::vector<const Node*> running_backward_roots() { return backward_roots; }

void queue_backward_callback(std::function<void()> fn) {
  LOCKSTEP_CHECK(in_backward(),
                 "queue_backward_callback: no backward pass is running on this thread; call it "
                 "from a gradient hook or an autograd node");
  callback_frames.back().push_back(std::move(fn));
}

void queue_outermost_backward_callback(std::function<void()> fn) {
  LOCKSTEP_CHECK(in_backward(),
                 "queue_outermost_backward_callback: no backward pass is running on this "
                 "thread; call it from a gradient hook or an autograd node");
  callback_frames.front().push_back(std::move(fn));
}

void run_backward(const Tensor& root, const Tensor& grad, bool retain_graph) {
  std::shared_ptr<Node> root_node = gradient_edge(root);
  LOCKSTEP_ASSERT(root_node != nullptr);
  run_graph(root_node, grad, retain_graph, nullptr);
}

void run_graph(const std::shared_ptr<Node>& root_node, const Tensor& seed, bool retain_graph,
               GradCapture* capture) {
  // The recomputation runs the function again, and with it this backward: its
  // gradients would be added twice, and the ops the region recorded so far
  // have no activations to give it yet.
  LOCKSTEP_CHECK(!in_checkpoint(),
                 "{} was called inside the checkpointed function of a checkpoint "
                 "region, which is not supported: backward recomputes the region by running "
                 "the function again. Call it after checkpoint() returns, or do not "
                 "checkpoint this function.", capture ? "autograd::grad()" : "backward()");
  // Each op's backward runs at the dtypes its forward ran at, even when
  // backward() is called inside an autocast scope.
  AutocastGuard no_autocast(AutocastState{});
  CallbackFrame frame(root_node.get());
  std::unordered_map<Node*, int> deps = count_dependencies(root_node.get());
  NodeRunner runner{capture};
  if (capture) runner.run = nodes_to_run(root_node.get(), *capture);
  const bool lanes = std::any_of(deps.begin(), deps.end(),
                                 [](const auto& entry) { return entry.first->lane() != 0; });
  if (lanes) {
    LanePass(std::move(deps), retain_graph, runner).run(root_node.get(), seed);
    frame.run_all();
    return;
  }
  std::unordered_map<Node*, Tensor> buffers;
  buffers[root_node.get()] = seed;

  NoGradGuard no_grad;
  std::priority_queue<Node*, std::vector<Node*>, LaterFirst> ready;
  ready.push(root_node.get());
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    Tensor input;
    if (auto it = buffers.find(node); it != buffers.end()) {
      input = std::move(it->second);
      buffers.erase(it);
    }
    std::vector<Tensor> outputs;
    if (input.defined()) outputs = runner(*node, std::move(input));
    if (!retain_graph && runner.runs(*node)) node->release_saved();
    for (size_t i = 0; i < node->next.size(); ++i) {
      Node* next = node->next[i].get();
      if (!next) continue;
      if (i < outputs.size() && outputs[i].defined()) {
        Tensor& buf = buffers[next];
        if (!buf.defined()) {
          buf = std::move(outputs[i]);
        } else if (buf.use_count() == 1 && buf.storage().use_count() == 1 &&
                   buf.is_contiguous()) {
          // Ours alone: accumulate in place. Not into a view whose elements
          // overlap (an expand() from sum's backward has stride 0).
          buf.add_(outputs[i]);
        } else {
          buf = add(buf, outputs[i]);
        }
      }
      if (--deps[next] == 0) ready.push(next);
    }
  }
  frame.run_all();
}

}  // namespace lockstep::runtime
