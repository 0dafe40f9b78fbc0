#include "lockstep/optim/partition.h"

#include <algorithm>
#include <map>
#include <numeric>

#include <fmt/format.h>

#include "lockstep/runtime/error.h"

namespace lockstep::optim {

namespace {

void check_sizes(const char* what, const std::vector<int64_t>& sizes, int world_size) {
  LOCKSTEP_CHECK(world_size >= 1, "{}: world size {} must be >= 1", what, world_size);
  for (size_t i = 0; i < sizes.size(); ++i) {
    LOCKSTEP_CHECK(sizes[i] >= 0, "{}: parameter {} has a negative size {}", what, i, sizes[i]);
  }
}

// owner and params_of from the pieces (which are in parameter order).
void index_pieces(Partition& p, size_t params) {
  p.owner.assign(params, -2);
  for (const Piece& piece : p.pieces) {
    int& o = p.owner[static_cast<size_t>(piece.param)];
    o = o == -2 ? piece.owner : -1;
    auto& mine = p.params_of[static_cast<size_t>(piece.owner)];
    if (mine.empty() || mine.back() != piece.param) mine.push_back(piece.param);
  }
}

}  // namespace

double Partition::imbalance() const {
  if (load.empty()) return 0.0;
  const int64_t total = std::accumulate(load.begin(), load.end(), int64_t{0});
  if (total == 0) return 0.0;
  const int64_t most = *std::max_element(load.begin(), load.end());
  return static_cast<double>(most) * static_cast<double>(load.size()) / static_cast<double>(total);
}

Partition partition_parameters(const std::vector<int64_t>& sizes, int world_size,
                               const std::vector<int64_t>& numels) {
  check_sizes("partition_parameters", sizes, world_size);
  LOCKSTEP_CHECK(numels.empty() || numels.size() == sizes.size(),
                 "partition_parameters: {} element counts for {} sizes", numels.size(), sizes.size());
  const int64_t n = static_cast<int64_t>(sizes.size());
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  // Largest first; equal sizes keep their index order (stable).
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return sizes[static_cast<size_t>(a)] > sizes[static_cast<size_t>(b)];
  });

  Partition p;
  p.params_of.assign(static_cast<size_t>(world_size), {});
  p.load.assign(static_cast<size_t>(world_size), 0);
  std::vector<int> owner(static_cast<size_t>(n), 0);
  for (int64_t i : order) {
    // min_element returns the first of equal minima: the lower rank wins ties.
    const auto least = std::min_element(p.load.begin(), p.load.end());
    owner[static_cast<size_t>(i)] = static_cast<int>(least - p.load.begin());
    *least += sizes[static_cast<size_t>(i)];
  }
  for (int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<size_t>(i);
    p.pieces.push_back({.param = i, .begin = 0, .end = numels.empty() ? sizes[k] : numels[k], .owner = owner[k]});
  }
  index_pieces(p, sizes.size());
  return p;
}

Partition partition_elements(const std::vector<int64_t>& numels, const std::vector<int>& spaces,
                             int world_size) {
  check_sizes("partition_elements", numels, world_size);
  LOCKSTEP_CHECK(spaces.size() == numels.size(), "partition_elements: {} spaces for {} parameters",
                 spaces.size(), numels.size());
  std::map<int, int64_t> total;  // per space
  for (size_t i = 0; i < numels.size(); ++i) total[spaces[i]] += numels[i];
  // Rank r's range of a line of T elements starts at floor(r*T/N), worked
  // out as q*r + floor(m*r/N) with T = q*N + m so that nothing overflows.
  auto start = [&](int64_t t, int r) {
    return t / world_size * r + t % world_size * r / world_size;
  };

  Partition p;
  p.params_of.assign(static_cast<size_t>(world_size), {});
  p.load.assign(static_cast<size_t>(world_size), 0);
  std::map<int, int64_t> cursor;  // per space: where the next parameter starts
  for (size_t i = 0; i < numels.size(); ++i) {
    const int64_t t = total[spaces[i]];
    const int64_t first = cursor[spaces[i]], last = first + numels[i];
    cursor[spaces[i]] = last;
    const auto index = static_cast<int64_t>(i);
    if (numels[i] == 0) {
      p.pieces.push_back({.param = index, .begin = 0, .end = 0, .owner = 0});
      continue;
    }
    for (int r = 0; r < world_size; ++r) {
      // This rank's range, clipped to the parameter, in the parameter's own numbering.
      const int64_t begin = std::max(first, start(t, r)), end = std::min(last, start(t, r + 1));
      if (begin >= end) continue;
      p.pieces.push_back({.param = index, .begin = begin - first, .end = end - first, .owner = r});
      p.load[static_cast<size_t>(r)] += end - begin;
    }
  }
  index_pieces(p, numels.size());
  return p;
}

}  // namespace lockstep::optim
