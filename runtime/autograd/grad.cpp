#include "lockstep/runtime/autograd/grad.h"

#include <memory>
#include <utility>

#include "lockstep/runtime/autograd/detail/engine.h"
#include "lockstep/runtime/autograd/detail/meta.h"
#include "lockstep/runtime/autograd/node.h"

namespace lockstep::runtime::autograd {

namespace {

// The root of a pass over several outputs: hands each its seed, as
// PyTorch's GraphRoot. Created last, so it runs first.
class GraphRoot final : public Node {
 public:
  explicit GraphRoot(std::vector<Tensor> seeds) : Node("GraphRoot"), seeds_(std::move(seeds)) {}
  std::vector<Tensor> apply(const Tensor&) override { return seeds_; }

 private:
  std::vector<Tensor> seeds_;
};

Tensor seed_for(const Tensor& out, const Tensor& given, size_t i) {
  if (!given.defined()) {
    LOCKSTEP_CHECK(out.numel() == 1,
                   "autograd::grad: output {} has shape {}; a gradient can be created "
                   "implicitly only for a one-element output, so pass one of that shape in "
                   "grad_outputs",
                   i, shape_str(out.shape()));
    return Tensor::ones(out.shape(), out.dtype(), out.device());
  }
  LOCKSTEP_CHECK(given.shape() == out.shape(),
                 "autograd::grad: grad_outputs[{}] has shape {} but output {} has shape {}", i,
                 shape_str(given.shape()), i, shape_str(out.shape()));
  LOCKSTEP_CHECK(given.device() == out.device(),
                 "autograd::grad: grad_outputs[{}] is on {} but output {} on {}", i,
                 given.device().str(), i, out.device().str());
  return given.dtype() == out.dtype() ? given.detach() : given.detach().to(out.dtype());
}

}  // namespace

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const GradOptions& options) {
  LOCKSTEP_CHECK(!options.create_graph,
                 "autograd::grad: create_graph=true (differentiating the gradient again) is not "
                 "supported: backward functions run without recording a graph");
  LOCKSTEP_CHECK(!outputs.empty() && !inputs.empty(),
                 "autograd::grad: needs at least one output and one input (got {} and {})",
                 outputs.size(), inputs.size());
  LOCKSTEP_CHECK(options.grad_outputs.empty() || options.grad_outputs.size() == outputs.size(),
                 "autograd::grad: {} grad_outputs for {} outputs; pass one per output, or none "
                 "for one-element outputs",
                 options.grad_outputs.size(), outputs.size());
  std::vector<Tensor> seeds;
  std::vector<std::shared_ptr<Node>> edges;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    LOCKSTEP_CHECK(out.defined() && out.requires_grad(),
                   "autograd::grad: output {} does not require grad and has no grad_fn, so "
                   "there is nothing to differentiate",
                   i);
    const Tensor none;
    seeds.push_back(seed_for(out, options.grad_outputs.empty() ? none : options.grad_outputs[i],
                             i));
    edges.push_back(gradient_edge(out));
  }
  auto root = std::make_shared<GraphRoot>(std::move(seeds));
  root->next = std::move(edges);

  GradCapture capture;
  capture.grads.resize(inputs.size());
  std::vector<std::shared_ptr<Node>> input_nodes;  // keeps a leaf's AccumulateGrad alive
  for (size_t i = 0; i < inputs.size(); ++i) {
    LOCKSTEP_CHECK(inputs[i].defined() && inputs[i].requires_grad(),
                   "autograd::grad: input {} does not require grad; only tensors that require "
                   "grad (leaves with requires_grad_(), or results computed from them) can be "
                   "differentiated with respect to",
                   i);
    input_nodes.push_back(gradient_edge(inputs[i]));
    capture.at[input_nodes.back().get()].push_back(i);
  }
  run_graph(root, Tensor::scalar(0), options.retain_graph, &capture);

  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor& g = capture.grads[i];
    LOCKSTEP_CHECK(g.defined() || options.allow_unused,
                   "autograd::grad: input {} (shape {}) appears to not have been used in the "
                   "graph of the outputs; pass allow_unused = true to get an undefined gradient "
                   "for it instead",
                   i, shape_str(inputs[i].shape()));
    if (g.defined() && g.dtype() != inputs[i].dtype()) g = g.to(inputs[i].dtype());
  }
  return std::move(capture.grads);
}

}  // namespace lockstep::runtime::autograd
