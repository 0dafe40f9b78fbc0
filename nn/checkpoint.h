// Checkpoint: runs a module under activation checkpointing
// (runtime/autograd/checkpoint.h): its activations are recomputed in backward
// instead of kept, for the cost of a second forward.
//
//   auto block = std::make_shared<nn::Checkpoint>(std::make_shared<MyBlock>());
//
// The wrapped module is the submodule "module", so its parameter names gain
// the prefix "module." (as DDP's and DataParallel's wrappers). To keep names
// unchanged, checkpoint inside the module's own forward instead, as
// GptConfig::checkpoint_blocks does. Non-tensor arguments and results of
// forward_values pass through as they are. A BatchNorm (or SyncBatchNorm)
// inside counts each batch in its running statistics once, in the forward,
// not again when backward recomputes it.
#pragma once

#include <memory>

#include "lockstep/nn/module.h"

namespace lockstep::nn {

class Checkpoint : public Module {
 public:
  explicit Checkpoint(std::shared_ptr<Module> module);
  Tensor forward(const Tensor& input) override;
  Values forward_values(const Values& inputs) override;
  std::string type_name() const override { return "Checkpoint"; }
  std::shared_ptr<Module> replicate() const override;

  // The wrapped module, bound to the child "module" (Module::bind_child):
  // replace_child("module", m) (convert_sync_batchnorm on a checkpointed
  // BatchNorm) points it at m. Read it; replace through replace_child.
  std::shared_ptr<Module> module;
};

}  // namespace lockstep::nn
