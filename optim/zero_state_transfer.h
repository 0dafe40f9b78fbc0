// How ZeroRedundancyOptimizer::consolidate_state_dict() moves state between
// ranks: each rank describes its state tensors as text (gathered by
// collectives/rank_text.h), and the consolidating rank stitches the
// pieces of split parameters back into whole tensors.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/optim/optimizer.h"

namespace lockstep::optim::zero_detail {

// One state tensor as consolidate_state_dict() describes it to the others.
struct EntryInfo {
  int64_t param = 0;           // global index
  int64_t begin = 0, end = 0;  // the piece's range of the parameter's flat elements
  std::string key;
  runtime::DType dtype = runtime::DType::f32;
  runtime::Shape shape;
};

std::string describe_entries(const std::vector<EntryInfo>& entries);
std::vector<EntryInfo> parse_entries(const std::string& text);

// Builds the full state from the pieces' entries on the consolidating rank.
// A whole piece's entry is taken as it is; a cut piece's elementwise entry is
// copied into its range of a tensor of the parameter's shape, and its 0-dim
// entries (equal in every piece) are taken from the first piece seen.
class Stitcher {
 public:
  Stitcher(const std::vector<Tensor>& params, OptimizerState& full) : params_(params), full_(full) {}

  void add(const EntryInfo& e, const Tensor& value);
  // Every stitched tensor got all of its elements (the pieces of a parameter
  // gain state together; anything else is a broken invariant).
  void check_complete() const;

 private:
  const std::vector<Tensor>& params_;
  OptimizerState& full_;
  std::map<std::pair<int64_t, std::string>, int64_t> covered_;
};

}  // namespace lockstep::optim::zero_detail
