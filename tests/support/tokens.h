// Next-token batches for the GPT tests.
#pragma once

#include <utility>
#include <vector>

#include "lockstep/runtime/random.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::testing {

// Token ids [rows, t] in [0, vocab) drawn with `seed`, and the next-token
// targets (the same sequences shifted by one).
inline std::pair<runtime::Tensor, runtime::Tensor> tokens(int64_t rows, int64_t t, int64_t vocab,
                                                         uint64_t seed) {
  runtime::Generator g(seed);
  std::vector<int64_t> ids(static_cast<size_t>(rows * (t + 1)));
  for (auto& id : ids) id = static_cast<int64_t>(g.next_u32() % static_cast<uint32_t>(vocab));
  const runtime::Tensor all = runtime::Tensor::from_vector(ids, {rows, t + 1});
  return {all.slice(1, 0, t).contiguous(), all.slice(1, 1, t + 1).contiguous()};
}

}  // namespace lockstep::testing
