// Keeping model replicas identical: the construction-time check that every
// rank holds the same parameters, and coalesced broadcasts from rank 0.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "lockstep/collectives/process_group.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::nn {

// Collective. Throws Error on every rank when the ranks' parameter lists
// differ in count, names, shapes or dtypes, naming the first differing
// parameter, what rank 0 holds and which ranks hold something else.
void verify_same_parameters(const std::vector<std::pair<std::string, runtime::Tensor>>& params,
                            collectives::ProcessGroup& group);

// Collective. Copies `root`'s values of `tensors` into every rank's, one
// broadcast per dtype (the tensors are packed into one flat buffer).
void broadcast_coalesced(const std::vector<runtime::Tensor>& tensors,
                         collectives::ProcessGroup& group, int root = 0);

}  // namespace lockstep::nn
