// Internal: the node at a leaf. Adds the incoming gradient into leaf.grad and
// then runs the leaf's post-accumulate-grad hooks (where DDP's reducer hooks in).
#pragma once

#include "lockstep/runtime/autograd/node.h"

namespace lockstep::runtime {

class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(const Tensor& leaf);
  std::vector<Tensor> apply(const Tensor& grad_output) override;
  const Tensor& leaf() const { return leaf_; }

 private:
  Tensor leaf_;  // a strong handle: the leaf outlives the graph that uses it
};

}  // namespace lockstep::runtime
