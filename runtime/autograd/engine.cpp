#include "lockstep/runtime/autograd/engine.h"

#include <deque>
#include <functional>
#include <queue>
#include <unordered_map>

#include "lockstep/runtime/autograd/backward_callbacks.h"

#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/autograd/meta.h"

namespace lockstep::runtime {

namespace {

// The callbacks of each backward pass running on this thread, innermost last
// (a hook may itself run a backward).
thread_local std::vector<std::deque<std::function<void()>>> callback_frames;

// Pops this pass's frame however the pass ends.
struct CallbackFrame {
  CallbackFrame() { callback_frames.emplace_back(); }
  ~CallbackFrame() { callback_frames.pop_back(); }
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

void queue_backward_callback(std::function<void()> fn) {
  LOCKSTEP_CHECK(in_backward(),
                 "queue_backward_callback: no backward pass is running on this thread; call it "
                 "from a gradient hook or an autograd node");
  callback_frames.back().push_back(std::move(fn));
}

void run_backward(const Tensor& root, const Tensor& grad, bool retain_graph) {
  CallbackFrame frame;
  std::shared_ptr<Node> root_node = gradient_edge(root);
  LOCKSTEP_ASSERT(root_node != nullptr);
  std::unordered_map<Node*, int> deps = count_dependencies(root_node.get());
  std::unordered_map<Node*, Tensor> buffers;
  buffers[root_node.get()] = grad;

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
    if (input.defined()) outputs = node->apply(input);
    input = Tensor();
    if (!retain_graph) node->release_saved();
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
