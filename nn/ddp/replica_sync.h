// Keeping model replicas identical: the construction-time checks that every
// rank holds the same parameters and buffers, and coalesced broadcasts from rank 0.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "lockstep/collectives/process_group.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::nn {

// Collective. Throws Error on every rank when the ranks' parameter lists
// differ in count, names, shapes, dtypes or requires_grad, naming the first
// differing parameter, what rank 0 holds and which ranks hold something else
// (for requires_grad: which ranks train it and which freeze it).
void verify_same_parameters(const std::vector<std::pair<std::string, runtime::Tensor>>& params,
                            collectives::ProcessGroup& group);

// Collective. The same for the buffers (names, shapes, dtypes), which DDP
// broadcasts from rank 0 packed together: ranks whose buffers differ would
// fail with a mismatched broadcast, or, where the totals agree, silently
// take each other's values in the wrong places.
void verify_same_buffers(const std::vector<std::pair<std::string, runtime::Tensor>>& buffers,
                         collectives::ProcessGroup& group);

// Collective. Throws Error on every rank when some parameter's bits differ
// between ranks (a 64-bit hash of each, one all-gather), naming the first
// such parameter and the ranks whose bits differ from rank 0's. `when` says
// where the check ran ("before training forward #300"). Device tensors are
// hashed on the host (one copy each).
void verify_replicas_identical(const std::vector<std::pair<std::string, runtime::Tensor>>& params,
                               collectives::ProcessGroup& group, const std::string& when);

// Collective. Copies `root`'s values of `tensors` into every rank's, one
// broadcast per dtype and device (the tensors are packed into one flat
// buffer on their device). Any
// dtype: u8 and bool tensors, which NCCL's collectives do not take, go
// packed as bytes.
void broadcast_coalesced(const std::vector<runtime::Tensor>& tensors,
                         collectives::ProcessGroup& group, int root = 0);

}  // namespace lockstep::nn
