// CPU tensors through an nccl group: each is copied to the group's device,
// the collective runs on the copies, and the Work's wait() copies the results
// back and blocks the host until they are there (a CPU tensor is read by the
// host, so waiting on a stream would not be enough).
//
// This is for the small control tensors that DDP, ZeRO and checkpoints
// exchange (flags, parameter counts, generator states); gradients and
// parameters should live on the device.
#pragma once

#include <memory>
#include <vector>

#include "lockstep/collectives/work.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::collectives::detail {

class NcclHostStaging {
 public:
  explicit NcclHostStaging(int device) : device_(device) {}

  // `t` itself when it is not on the CPU; otherwise its copy on the device,
  // which wait() copies back into `t` when `result` is set.
  runtime::Tensor stage(const runtime::Tensor& t, bool result);
  bool any() const { return !staged_.empty(); }
  // The Work to hand out for `inner`, the collective on the staged copies.
  std::shared_ptr<Work> wrap(std::shared_ptr<Work> inner);

 private:
  struct Staged {
    runtime::Tensor host;
    runtime::Tensor device;
    bool result;
  };
  int device_;
  std::vector<Staged> staged_;
};

}  // namespace lockstep::collectives::detail
